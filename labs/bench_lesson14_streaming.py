"""Lesson 14 benchmark: a large pretrain jsonl trains with memory bounded by its offset index, not its size.

    python labs/bench_lesson14_streaming.py --size_mb 700                     # generates /tmp/..., deletes it after
    python labs/bench_lesson14_streaming.py --data_path pretrain_hq.jsonl --tokenizer_path model/

1. with no --data_path, writes a jsonl of --size_mb MB (the tiny corpus's texts, numbered, repeated);
2. builds ``PretrainDataset`` (one checking pass that records each line's byte offset);
3. trains the tiny model on --steps shuffled micro-batches read through the index;
4. prints the file size, the index's size, the RSS growth while indexing, and the process's peak RSS
   against the peak before the data was touched (torch, the model and two warm-up steps on a dummy batch).
"""
from __future__ import annotations

import argparse
import itertools
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from course.minimind import (TINY_CORPUS, TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig,
                             MiniMindForCausalLM, PretrainDataset, load_tokenizer, read_jsonl_texts, setup_seed)

MIB = 2**20


def write_large_jsonl(path: Path, target_bytes: int) -> int:
    """Tiny-corpus texts, numbered, repeated until the file holds ``target_bytes``; returns its lines."""
    texts = read_jsonl_texts(TINY_CORPUS)
    lines = written = 0
    with path.open("w", encoding="utf-8") as handle:
        while written < target_bytes:
            line = json.dumps({"text": f"{lines}: {texts[lines % len(texts)]}"}, ensure_ascii=False) + "\n"
            handle.write(line)
            written += len(line.encode("utf-8"))
            lines += 1
    return lines


def current_rss_mib() -> float:
    """Resident set size now, from /proc (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / MIB


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def train_step(model, optimizer, input_ids, labels) -> None:
    model(input_ids, labels=labels).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def bench(data_path: Path, tokenizer_path, steps: int, batch_size: int, max_seq_len: int) -> None:
    tokenizer = load_tokenizer(tokenizer_path)
    setup_seed(42)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=TINY_HIDDEN_SIZE, num_hidden_layers=TINY_NUM_HIDDEN_LAYERS,
                                               vocab_size=tokenizer.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    warm_up = torch.full((batch_size, max_seq_len), tokenizer.bos_token_id)
    for _ in range(2):  # autograd buffers, AdamW state and the step's transients: not the data's cost
        train_step(model, optimizer, warm_up, warm_up)
    baseline, baseline_peak = current_rss_mib(), peak_rss_mib()
    start = time.perf_counter()
    dataset = PretrainDataset(data_path, tokenizer, max_length=max_seq_len)
    index_seconds = time.perf_counter() - start
    indexed = current_rss_mib()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    start = time.perf_counter()
    for input_ids, labels in itertools.islice(loader, steps):
        train_step(model, optimizer, input_ids, labels)
    train_seconds = time.perf_counter() - start
    size, peak = data_path.stat().st_size, peak_rss_mib()
    print(f"file: {data_path} {size / MIB:.1f} MiB, {len(dataset):,} lines")
    print(f"index: {dataset.samples.offsets.itemsize * len(dataset) / MIB:.1f} MiB of offsets, "
          f"built in {index_seconds:.1f} s")
    print(f"train: {steps} micro-batches of {batch_size} x {max_seq_len} tokens in {train_seconds:.1f} s")
    print(f"rss: {baseline:.0f} MiB before the data (peak {baseline_peak:.0f} MiB), {indexed:.0f} MiB after "
          f"indexing (+{indexed - baseline:.0f} MiB)")
    print(f"peak rss: {peak:.0f} MiB, +{peak - baseline_peak:.0f} MiB over training without data "
          f"= {(peak - baseline_peak) * MIB / size:.1%} of the file")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_path", default=None, help="an existing jsonl (default: generate one)")
    parser.add_argument("--size_mb", type=int, default=700, help="size of the generated file in MiB")
    parser.add_argument("--tokenizer_path", default=None, help="a tokenizer.json or its directory")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_seq_len", type=int, default=64)
    args = parser.parse_args(argv)
    for name in ("size_mb", "steps", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.max_seq_len < 3:
        parser.error(f"--max_seq_len must be >= 3 (bos + a token + eos), got {args.max_seq_len}")
    if args.data_path is not None:
        bench(Path(args.data_path), args.tokenizer_path, args.steps, args.batch_size, args.max_seq_len)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench_streaming.jsonl"
        start = time.perf_counter()
        write_large_jsonl(path, args.size_mb * MIB)
        print(f"generated {path} in {time.perf_counter() - start:.1f} s")
        bench(path, args.tokenizer_path, args.steps, args.batch_size, args.max_seq_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
