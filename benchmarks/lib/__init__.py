"""Helpers shared by the benchmark scripts: prompt sets (prompts), the llama.cpp build and server (llamacpp), ONNX
Runtime GenAI's loop (genai), transformers (hf), edge-spec's worker (edge), one-process measurement (measure), step
timing (timing), the vs_llamacpp targets (targets), the speculative-step profile (profile_spec), and run_all's
bench target, bandwidth and report (bench_target, bandwidth, report). Not entry points: benchmarks/README.md lists
those."""
