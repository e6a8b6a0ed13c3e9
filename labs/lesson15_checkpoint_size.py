"""Checkpoint sizes from the parameter count: the course's tiny model vs upstream's default (~64M) model.

    python labs/lesson15_checkpoint_size.py

The models are built on the meta device (shapes only, no memory, no file written). Sizes are tensor
bytes; a real file adds a little pickle overhead (lesson 15 notes §2 shows the tiny model's files, measured).
  fp32 resume (lesson 15)   fp32 weights (tied embedding stored once) + AdamW exp_avg + exp_avg_sq, 4 bytes each
  fp16 resume (upstream)    every state_dict entry .half()-ed separately (the tied embedding and lm_head
                            become two tensors) + the same fp32 AdamW moments
"""
from __future__ import annotations

import argparse

import torch

from course.minimind import TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig, MiniMindForCausalLM
from course.runs.threads import cpu_threads

FP32, FP16 = 4, 2
ADAMW_MOMENTS = 2   # exp_avg and exp_avg_sq, fp32, one of each per parameter
MB = 1e6


def sizes(config: MiniMindConfig) -> dict:
    with torch.device("meta"):
        model = MiniMindForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    state_dict_entries = sum(t.numel() for t in model.state_dict().values())
    moments = ADAMW_MOMENTS * FP32 * params
    return {"params": params, "embedding": model.model.embed_tokens.weight.numel(),
            "fp32 weights": FP32 * params, "fp16 weights": FP16 * state_dict_entries,
            "fp32 resume": FP32 * params + moments, "fp16 resume": FP16 * state_dict_entries + moments}


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    configs = {f"tiny (hidden {TINY_HIDDEN_SIZE}, {TINY_NUM_HIDDEN_LAYERS} layers)":
               MiniMindConfig(hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS),
               "upstream default (hidden 768, 8 layers)": MiniMindConfig()}
    for name, config in configs.items():
        s = sizes(config)
        print(f"{name}: {s['params']:,} parameters, embedding {s['embedding'] / s['params']:.1%} of them")
        print(f"  weights: fp32 {s['fp32 weights'] / MB:.2f} MB, fp16 {s['fp16 weights'] / MB:.2f} MB "
              f"({s['fp16 weights'] / s['fp32 weights']:.1%} of fp32)")
        print(f"  resume:  fp32 {s['fp32 resume'] / MB:.2f} MB, upstream fp16 {s['fp16 resume'] / MB:.2f} MB "
              f"({s['fp16 resume'] / s['fp32 resume']:.1%} of fp32)")


if __name__ == "__main__":
    main()
