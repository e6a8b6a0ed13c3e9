"""``python -m course chat``: talk to a weights file, one user line per turn, through upstream's chat template.

The conversation so far (an optional --system message, every user line and every answer) is the prompt of the
next answer, rendered by ``course/minimind/sft.py::render_chat`` with the generation prompt, as upstream's
eval_llm.py does. Greedy by default; --sample draws with --temperature and --top_p from a generator seeded with
--seed plus the turn's number, so a run is reproducible. An empty line or the end of stdin ends it. When stdin is
a terminal, a banner and a prompt go to stderr; stdout holds the answers alone, one line a turn, either way.
"""
from __future__ import annotations

import argparse
import itertools
import sys

from course.input_errors import InputError
from course.minimind import load_tokenizer
from course.runs.threads import add_threads_argument, cpu_threads
from course.trainers.pretrain import STORIES_TOKENIZER, tokenizer_name
from course.trainers.sft import answer, model_from_weights


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", required=True, metavar="PATH",
                        help="a model state dict, e.g. out/full_sft_128.pth (fp16 or fp32; the model's shape is "
                             "read from it)")
    parser.add_argument("--tokenizer_path", default=None,
                        help="a tokenizer.json or its directory (default: the stories tokenizer, "
                             "labs/data/stories_tokenizer, for a model of its vocabulary size, else the built-in "
                             "byte tokenizer)")
    parser.add_argument("--system", default=None, metavar="TEXT", help="a system message opening the conversation")
    parser.add_argument("--sample", action="store_true", help="draw each token instead of taking the likeliest")
    parser.add_argument("--temperature", type=float, default=0.85, help="with --sample (upstream's eval default)")
    parser.add_argument("--top_p", type=float, default=0.85, help="with --sample: nucleus size (upstream's default)")
    parser.add_argument("--seed", type=int, default=0, help="with --sample: turn t draws with seed + t")
    parser.add_argument("--max_new_tokens", type=int, default=128, help="the longest answer")
    parser.add_argument("--max_seq_len", type=int, default=512,
                        help="the model sees the last this many tokens of the conversation")
    add_threads_argument(parser)


def check_arguments(args) -> None:
    for name in ("max_new_tokens", "max_seq_len"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.temperature > 0:
        raise InputError(f"--temperature must be > 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise InputError(f"--top_p must be in (0, 1], got {args.top_p}")


PROMPT = "you> "


def default_tokenizer(model) -> tuple:
    """(path, tokenizer): the tokenizer of the course's stories models (the pretrain and SFT stages' default) when
    the model has its vocabulary size, else (None, the built-in byte tokenizer: the tiny preset's)."""
    stories = load_tokenizer(STORIES_TOKENIZER)
    if stories.vocab_size == model.config.vocab_size:
        return STORIES_TOKENIZER, stories
    return None, load_tokenizer(None)


def banner(args, model, tokenizer_path) -> str:
    """What is loaded and how to end, for a person at a terminal."""
    config = model.config
    return (f"chat with {args.weights} (hidden size {config.hidden_size}, {config.num_hidden_layers} layer(s), "
            f"{config.vocab_size}-token vocabulary; tokenizer: {tokenizer_name(tokenizer_path)}; "
            f"{'sampled' if args.sample else 'greedy'} answers): one line a turn, an empty line or Ctrl-D ends")


def chat(args, stdin=None, stdout=None, stderr=None) -> int:
    """Answer each line of ``stdin`` on one line of ``stdout`` until an empty line or its end (defaults: the
    process's streams); exit code 0. When ``stdin`` is a terminal, a banner and a prompt before each line go to
    ``stderr``. Bad arguments or files raise an InputError before the first answer."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    check_arguments(args)
    with cpu_threads(args.threads):
        model = model_from_weights(args.weights, "--weights")
        tokenizer_path, tokenizer = ((args.tokenizer_path, load_tokenizer(args.tokenizer_path)) if args.tokenizer_path
                                     else default_tokenizer(model))
        if tokenizer.vocab_size != model.config.vocab_size:
            raise InputError(f"--tokenizer_path {args.tokenizer_path or '(the built-in byte tokenizer)'}: "
                             f"{tokenizer.vocab_size} tokens, the model in --weights has {model.config.vocab_size}")
        interactive = stdin.isatty()
        if interactive:
            print(banner(args, model, tokenizer_path), file=stderr)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        for turn in itertools.count():
            if interactive:
                print(PROMPT, end="", file=stderr, flush=True)
            line = stdin.readline()
            if not line.strip():
                if interactive and not line:  # Ctrl-D: the shell's prompt on a line of its own
                    print(file=stderr)
                break
            messages.append({"role": "user", "content": line.rstrip("\n")})
            reply = answer(model, tokenizer, messages, args.max_new_tokens, args.max_seq_len, "cpu",
                           temperature=args.temperature if args.sample else 0.0, top_p=args.top_p,
                           seed=args.seed + turn)
            messages.append({"role": "assistant", "content": reply})
            print(" ".join(reply.splitlines()), file=stdout, flush=True)  # one line per turn, even if it wrote more
    return 0
