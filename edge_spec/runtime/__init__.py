"""The lean runtime: onnxruntime + numpy + tokenizers only. Never import torch, transformers or onnx here."""
