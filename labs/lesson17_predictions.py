"""The answers to lesson 17 §4.1's predictions, measured with the oracle (upstream's SFT data path and weight load,
course/minimind/sft.py) and the lesson-17 reference (course/reference/sft.py).

    python labs/lesson17_predictions.py

Each block runs on the CPU and prints what its prediction asked for:
  1. a one-turn conversation's labels, upstream's tokenizer: its targets, and how many are the answer's own text;
  2. an answer that starts with two spaces: its targets with the empty think block, and without it;
  3. two samples cut by max_length, inside the answer and before it: their targets, upstream's loss (the mean of
     micro-batch means) and the token-weighted update of the two (sft_epoch on lesson 16's session);
  4. a weights file saved through torch.compile, loaded by upstream's init_model and by load_pretrained_weights;
  5. the micro-batches of an update of §6.2's lab: the weight of one target under loss / K and token weighting;
  6. upstream's SFTDataset, its global random: dataset[0] read ten times.
"""
from __future__ import annotations

import random
import tempfile
from fractions import Fraction
from pathlib import Path

import torch

from course.experiments.token_weighting import SFT_SETUP, global_batches
from course.minimind import IGNORE_INDEX
from course.minimind.sft import EMPTY_THINK_BLOCK, SYSTEM_PROMPTS, SFTDataset, load_weights_like_upstream
from course.protocol.text import TextBatch, shifted_target_count
from course.reference import sft as reference
from course.reference import train_session as lesson16
from course.runs import params_of, session_model
from course.runs.sft import SFT_TINY_CORPUS, sft_dataset, sft_sample, upstream_tokenizer
from course.runs.threads import cpu_threads

COLOR = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "Red."}]
CODE = [{"role": "user", "content": "Show a Python line that prints one."},
        {"role": "assistant", "content": "  print(1)"}]
LONG_QUESTION = [{"role": "user", "content": "Please read this long question before you answer it: which color is "
                  "the sky on a clear day?"}, {"role": "assistant", "content": "Blue."}]
LAB_UPDATE = 4   # the update of §6.2's lab whose micro-batches prediction 5 weighs


def shown(ids) -> str:
    """Each id as the text of its token (special tokens by name, a newline as \\n), in brackets."""
    decode = upstream_tokenizer().decode
    return " ".join("[" + decode([i], skip_special_tokens=False).replace("\n", "\\n") + "]" for i in ids)


def targets(labels) -> list[int]:
    return [label for label in labels if label != IGNORE_INDEX]


def mask_of_one_turn() -> None:
    found = targets(sft_sample(COLOR, 48).labels)
    answer = upstream_tokenizer()("Red.", add_special_tokens=False).input_ids
    print('1. "Name a color." -> "Red.", empty think block kept (as rendered), max_length 48:')
    print(f"   {len(found)} targets: {shown(found)}")
    print(f"   the answer's own text: {len(answer)} of them; the first target id {found[0]}, the last two "
          f"{found[-2]} and {found[-1]}")


def answer_with_two_spaces() -> None:
    kept, removed = sft_sample(CODE, 48), sft_sample(CODE, 48, empty_think_removed=True)
    turn = removed.input_ids.index(removed.assistant_start[0], 1)
    after = removed.input_ids[turn:turn + len(removed.assistant_start)]
    print('2. "Show a Python line that prints one." -> "  print(1)":')
    print(f"   empty think block kept: {len(targets(kept.labels))} targets; removed (upstream: 80 % of samples): "
          f"{len(targets(removed.labels))} targets")
    print(f"   removed, the assistant turn opens with {after} = {shown(after)}; the marker is "
          f"{removed.assistant_start} = {shown(removed.assistant_start)}")


def truncated_samples() -> None:
    inside, before = sft_sample(COLOR, 24), sft_sample(LONG_QUESTION, 24)
    last = max(i for i, label in enumerate(inside.labels) if label != IGNORE_INDEX)
    print("3. cut to max_length 24:")
    print(f'   "Name a color." -> "Red.", cut inside its answer: {len(targets(inside.labels))} targets, the last at '
          f"position {last}")
    print(f"   the long question, cut before its answer: {len(targets(before.labels))} targets")
    batches = [TextBatch(torch.tensor([s.input_ids]), torch.tensor([s.labels]),
                         shifted_target_count(torch.tensor([s.labels]))) for s in (before, inside)]
    model = session_model()
    with torch.no_grad():
        means = [float(model(b.input_ids, labels=b.labels).loss) for b in batches]
    print(f"   upstream, the two as K = 2 micro-batches: means {means[0]:.2f} and {means[1]:.2f}, loss / K "
          f"{sum(means) / 2:.2f}")
    session = lesson16.TrainingSession(model, torch.optim.SGD(model.parameters(), lr=0.0), accumulation_steps=2)
    report, = reference.sft_epoch(session, batches, 2)
    print(f"   token-weighted (sft_epoch): normalization units "
          f"{reference.update_normalization_units([b.labels for b in batches], 2)}, update loss "
          f"{float(report.loss_sum) / report.loss_units:.2f} over {report.loss_units} targets, parameters finite "
          f"{all(bool(p.isfinite().all()) for p in model.parameters())}")


def compiled_weights_file() -> None:
    pretrained = session_model()
    with torch.no_grad():
        for param in pretrained.parameters():
            param.add_(1.0)
    file, fresh = params_of(pretrained), params_of(session_model())
    with tempfile.TemporaryDirectory(prefix="lesson17-") as folder:
        path = Path(folder) / "pretrain_32.pth"
        torch.save({f"_orig_mod.{k}": v for k, v in pretrained.state_dict().items()}, path)
        model = session_model()
        missing, unexpected = load_weights_like_upstream(model, path)
        loaded = params_of(model)
        print("4. a tiny model's weights saved through torch.compile (every key prefixed _orig_mod.):")
        print(f"   upstream's init_model, load_state_dict(strict=False): no error; missing {len(missing)} keys, "
              f"unexpected {len(unexpected)}; parameters equal to the file's "
              f"{sum(torch.equal(p, file[n]) for n, p in loaded.items())} of {len(loaded)}, to a fresh model's "
              f"{sum(torch.equal(p, fresh[n]) for n, p in loaded.items())}")
        model = session_model()
        try:
            reference.load_pretrained_weights(model, path)
        except ValueError as exc:
            print(f"   load_pretrained_weights: {type(exc).__name__} naming model.norm.weight "
                  f"{'model.norm.weight' in str(exc)} and _orig_mod.model.norm.weight "
                  f"{'_orig_mod.model.norm.weight' in str(exc)}; the model unchanged "
                  f"{all(torch.equal(p, fresh[n]) for n, p in params_of(model).items())}")


def weights_in_an_update() -> None:
    setup = SFT_SETUP
    units = [b.loss_units for b in global_batches(lesson16, sft_dataset(setup.max_seq_len, seed=setup.seed),
                                                  setup)[LAB_UPDATE - 1]]
    k, n = len(units), sum(units)
    naive = [Fraction(1, k * count) for count in units]
    print(f"5. update {LAB_UPDATE} of §6.2's lab: K = {k} micro-batches holding {units} assistant targets, N = {n}:")
    print(f"   loss / K: one target weighs {', '.join(map(str, naive))}; the sparsest's "
          f"{float(max(naive) / min(naive)):.1f} times the densest's")
    print(f"   token-weighted: one target weighs 1/{n} in each")


def sample_of_an_index() -> None:
    state = random.getstate()
    random.seed(42)   # upstream seeds its global random once; the draws then follow every earlier one
    try:
        dataset = SFTDataset(SFT_TINY_CORPUS, upstream_tokenizer(), SFT_SETUP.max_seq_len)
        prompts = [dataset.sample_prompt(0) for _ in range(10)]
    finally:
        random.setstate(state)
    print("6. upstream's SFTDataset (its global random, seeded once), dataset[0] read 10 times:")
    print(f"   {len(set(prompts))} different prompts: a system prompt in "
          f"{sum(any(p in prompt for p in SYSTEM_PROMPTS) for prompt in prompts)}, the empty think block removed in "
          f"{sum(EMPTY_THINK_BLOCK not in prompt for prompt in prompts)}")


@cpu_threads()   # one thread unless OMP_NUM_THREADS says otherwise (course/runs/threads.py)
def main() -> None:
    mask_of_one_turn()
    answer_with_two_spaces()
    truncated_samples()
    compiled_weights_file()
    weights_in_an_update()
    sample_of_an_index()


if __name__ == "__main__":
    main()
