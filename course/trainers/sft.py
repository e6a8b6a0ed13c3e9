"""The SFT stage's reusable pieces (``impl/train_full_sft_impl.py``, lesson 17, and ``python -m course chat``):
conversations labelled by an ``assistant_labels``, their micro-batches, the assistant's answer to a conversation,
the held-out exact-answer score, and a model read from a weights file whatever its shape."""
from __future__ import annotations

import re
from typing import Iterator

import torch
from torch.utils.data import DataLoader

from course.implementations import REPO_ROOT, load_module
from course.input_errors import InputError
from course.minimind import MiniMindConfig, MiniMindForCausalLM
from course.minimind.dataset import JsonlRecords
from course.minimind.sft import SFTDataset, padded_prompt_ids, parse_conversations, read_state_dict, render_chat
from course.experiments.step_timing import Peak
from course.protocol.text import TextBatch, shifted_target_count
from course.reference import step_costs as lesson18
from course.trainers.pretrain import decode, generate_ids

# The built-in chat corpus and its scoring rule (labs/data/make_sft_stories.py writes both files).
STORIES_CHATS = load_module(REPO_ROOT / "labs" / "data" / "make_sft_stories.py", "make_sft_stories")
STORIES_SFT_CORPUS = STORIES_CHATS.TRAIN_OUT
STORIES_SFT_HELDOUT = STORIES_CHATS.HELDOUT_OUT


def answer_is_exact(prediction: str, reference: str) -> bool:
    """The held-out score of one answer: the chat corpus's own rule (case, punctuation and spacing ignored)."""
    return STORIES_CHATS.answer_matches(prediction, reference)


class AssistantMaskedDataset(SFTDataset):
    """Upstream's ``SFTDataset`` (its chat template, random system prompts and think-block removal, cut and
    padding) with the labels of ``assistant_labels`` (lesson 17 §5.1) in place of upstream's own."""

    def __init__(self, jsonl_path, tokenizer, max_length: int, assistant_labels, rng=None, **ratios):
        super().__init__(jsonl_path, tokenizer, max_length, rng, **ratios)
        self.assistant_labels = assistant_labels

    def encode_prompt(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids = padded_prompt_ids(prompt, self.tokenizer, self.max_length)
        labels = self.assistant_labels(list(input_ids), list(self.assistant_start_ids), list(self.end_ids))
        if len(labels) != len(input_ids):
            raise ValueError(f"assistant_labels returned {len(labels)} labels for {len(input_ids)} input_ids")
        return torch.tensor(input_ids, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


def kept_positions(labels: torch.Tensor) -> int:
    """The positions a sample (or a batch) of ``labels`` keeps once trimmed: up to its last target (1 without)."""
    targets = (labels != -100).reshape(-1, labels.shape[-1]).any(dim=0).nonzero()
    return int(targets[-1]) + 1 if len(targets) else 1


def trimmed(input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch cut after its last target: the positions after it feed no loss (the model is causal), so the
    loss and its gradients are unchanged, and a batch of short conversations costs what they hold, not
    max_seq_len (upstream pads every sample to max_seq_len)."""
    end = kept_positions(labels)
    return input_ids[:, :end], labels[:, :end]


def text_batch(samples: list) -> TextBatch:
    """The ``TextBatch`` of ``(input_ids, labels)`` samples, trimmed after their last target."""
    input_ids, labels = trimmed(torch.stack([ids for ids, _ in samples]), torch.stack([y for _, y in samples]))
    return TextBatch(input_ids, labels, shifted_target_count(labels))


def micro_batches(dataset, order: list[int], batch_size: int, length_pool: int = 0) -> Iterator[TextBatch]:
    """The ``TextBatch``es of ``dataset``'s samples drawn in ``order``, ``batch_size`` at a time (the last may be
    smaller). ``length_pool`` 0: upstream's random micro-batches. Else each run of that many micro-batches' samples
    is drawn, sorted by the positions each keeps, cut into micro-batches, and these go out in a random order
    (torch's generator; a short one last): similar lengths, little padding, one run in memory."""
    run = batch_size * max(length_pool, 1)
    for start in range(0, len(order), run):
        drawn = [dataset[i] for i in order[start:start + run]]
        if length_pool:
            drawn.sort(key=lambda sample: kept_positions(sample[1]))
        batches = [drawn[i:i + batch_size] for i in range(0, len(drawn), batch_size)]
        if length_pool:
            short = [batches.pop()] if len(batches[-1]) < batch_size else []   # only the epoch's last run
            batches = [batches[i] for i in torch.randperm(len(batches)).tolist()] + short
        yield from map(text_batch, batches)


def position_flops(config: MiniMindConfig, batches, pad_token_id: int) -> int:
    """The training FLOPs of the micro-batches' non-padding positions, the prompts' too (the answers' targets need
    them), each at its micro-batch's length (lesson 18's reference flops_per_token): what an SFT MFU counts."""
    return sum(int((batch.input_ids != pad_token_id).sum())
               * lesson18.flops_per_token(config, batch.input_ids.shape[1], training=True) for batch in batches)


def sft_mfu(flops: int, tokens: int, seconds: float, peak: Peak) -> float:
    """The MFU of ``flops`` (position_flops) spent on ``tokens`` target tokens in ``seconds``: lesson 18's mfu of the
    FLOPs per target token at the target tokens/s."""
    return lesson18.mfu(flops / tokens, tokens / seconds, peak.flops_per_second) if tokens and seconds > 0 else 0.0


def sft_mfu_line(flops: int, tokens: int, seconds: float, peak: Peak) -> str:
    """The SFT report card's MFU line."""
    return (f"MFU {sft_mfu(flops, tokens, seconds, peak):.2%}: {flops:,} training FLOPs of the non-padding positions "
            f"(lesson 18's flops_per_token at each micro-batch's length; {flops / max(tokens, 1):,.0f} per target "
            f"token) in {seconds:.3f} s of sft_epoch, against {peak.flops_per_second / 1e9:,.1f} GFLOP/s "
            f"({peak.source})")


def validation_batches(dataset, batch_size: int) -> list:
    """``(input_ids, labels)`` batches of the whole of ``dataset``, in order, trimmed after their last target."""
    return [trimmed(input_ids, labels) for input_ids, labels in DataLoader(dataset, batch_size=batch_size)]


def answer(model, tokenizer, messages: list[dict], max_new_tokens: int, max_seq_len: int, device,
           temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> str:
    """The assistant's next turn after ``messages`` (the last one the user's), prompted as upstream's chat
    template prompts it (``add_generation_prompt``); greedy unless ``temperature`` > 0 (then seeded)."""
    ids = tokenizer(render_chat(messages, add_generation_prompt=True), add_special_tokens=False).input_ids
    new = generate_ids(model, ids, max_new_tokens, max_seq_len, device, tokenizer.eos_token_id,
                       temperature=temperature, top_p=top_p, seed=seed)
    return decode(tokenizer, new).strip()


def heldout_questions(path) -> list[tuple[list[dict], str]]:
    """Every assistant turn of a chat jsonl as ``(the messages before it, its content)``: the reference answers
    of earlier turns stay in the history, so each question is scored on its own."""
    records = JsonlRecords(path, parse_conversations)
    return [(conversation[:i], message["content"])
            for conversation in map(records.__getitem__, range(len(records)))
            for i, message in enumerate(conversation) if message["role"] == "assistant"]


def last_question(messages: list[dict]) -> str:
    """The last line of the last user turn: the question, without the story before it."""
    return messages[-1]["content"].splitlines()[-1]


def story_of(messages: list[dict]) -> str:
    """The story a held-out question is about: the first user turn without its last line (the first question)."""
    first = next(message["content"] for message in messages if message["role"] == "user")
    return " ".join(first.splitlines()[:-1])


def answers_table(questions: list[tuple[list[dict], str]], answers: dict[str, list[str]]) -> list[str]:
    """The report card's markdown table of the shown held-out ``questions`` (history, reference answer): each one's
    story, question and reference beside the model's answer at each point of ``answers`` (e.g. "before SFT": one
    answer a question; an empty one shows as "(empty)")."""
    lines = [f"| story | question | reference | {' | '.join(answers)} |", "| --- " * (3 + len(answers)) + "|"]
    for i, (history, reference) in enumerate(questions):
        row = [story_of(history), last_question(history), reference,
               *(at_point[i] or "(empty)" for at_point in answers.values())]
        lines.append("| " + " | ".join(text.replace("|", "\\|") for text in row) + " |")  # a | would end the cell
    return lines


def exact_answers(predictions: list[str], references: list[str]) -> int:
    """How many predictions equal their reference answer (``answer_is_exact``)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    return sum(map(answer_is_exact, predictions, references))


def score_line(matches: int, total: int) -> str:
    return f"held-out exact answers: {matches}/{total} ({100 * matches / total:.1f} %)"


LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.")
EXPERT_KEY = re.compile(r"model\.layers\.0\.mlp\.experts\.(\d+)\.")


def config_of(state_dict: dict) -> MiniMindConfig:
    """The shape of the model a state dict holds: vocabulary and hidden size from the embedding, the layers and
    experts from the key names; every other field is MiniMind's default (a file that differs there does not load)."""
    embedding = state_dict.get("model.embed_tokens.weight")
    if not isinstance(embedding, torch.Tensor) or embedding.dim() != 2:
        raise InputError("holds no model.embed_tokens.weight matrix: not a MiniMind state dict (a resume "
                         "checkpoint keeps it under 'model')")
    layers = {int(m[1]) for m in map(LAYER_KEY.match, state_dict) if m}
    experts = {int(m[1]) for m in map(EXPERT_KEY.match, state_dict) if m}
    try:
        return MiniMindConfig(vocab_size=embedding.shape[0], hidden_size=embedding.shape[1],
                              num_hidden_layers=max(layers, default=-1) + 1, use_moe=bool(experts),
                              num_experts=len(experts) or MiniMindConfig.num_experts)
    except ValueError as exc:
        raise InputError(f"no MiniMind model has this shape ({exc})") from None


def model_from_weights(path, flag: str) -> MiniMindForCausalLM:
    """The fp32 model a weights file holds (either dtype, every key of the model and no other, each of its
    shape), in eval mode; anything else is an InputError naming ``flag``."""
    try:
        state_dict = read_state_dict(path)
        model = MiniMindForCausalLM(config_of(state_dict))
        model.load_state_dict(state_dict)
    except InputError as exc:
        raise InputError(f"{flag} {path}: {exc}") from None
    except RuntimeError as exc:  # load_state_dict: missing or unexpected keys, shapes that differ
        raise InputError(f"{flag} {path}: not a weights file of a MiniMind model ({' '.join(str(exc).split())})"
                         ) from None
    return model.eval()
