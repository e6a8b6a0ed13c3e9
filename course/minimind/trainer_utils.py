"""Trainer helpers mirroring upstream ``trainer/trainer_utils.py``."""
from __future__ import annotations

import math
import os
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler


def get_lr(current_step, total_steps, lr):
    """Upstream ``get_lr``: cosine from ``lr`` down to ``0.1 * lr``, no warmup. Kept verbatim in
    behaviour (no argument checks) because it is the oracle the exercises are compared with."""
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * current_step / total_steps)))


def setup_seed(seed: int) -> None:
    """Upstream ``setup_seed``: seed every RNG the loop touches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def Logger(content) -> None:  # noqa: N802 - upstream's name
    """Upstream prints only on the main process; the course runs a single process here."""
    print(content)


class SkipBatchSampler(Sampler):
    """Upstream ``SkipBatchSampler``: batches ``indices`` in order, drops the first ``skip_batches``
    full batches (already trained before the resume) and keeps the final partial batch. No argument
    checks, like upstream: a skip past the end just yields nothing."""

    def __init__(self, sampler, batch_size, skip_batches=0):
        self.sampler = sampler
        self.batch_size = batch_size
        self.skip_batches = skip_batches

    def __iter__(self):
        batch, skipped = [], 0
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                if skipped < self.skip_batches:
                    skipped += 1
                    batch = []
                    continue
                yield batch
                batch = []
        if len(batch) > 0 and skipped >= self.skip_batches:
            yield batch

    def __len__(self):
        total_batches = (len(self.sampler) + self.batch_size - 1) // self.batch_size
        return max(0, total_batches - self.skip_batches)


def current_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def fp16_state_dict(model) -> dict:
    """Upstream's saved weights: each state_dict entry ``.half().cpu()`` (tied fp32 tensors: two copies)."""
    return {name: tensor.half().cpu() for name, tensor in model.state_dict().items()}


def lm_checkpoint(lm_config, weight="pretrain", model=None, optimizer=None, epoch=0, step=0,
                  save_dir="checkpoints", **kwargs):
    """Upstream ``lm_checkpoint`` (wandb left out). With ``model``: write the fp16 weights file
    ``{weight}_{hidden}[_moe].pth`` and the resume file ``..._resume.pth``, each to a ``.tmp`` then
    ``os.replace``; ``kwargs`` (e.g. ``scaler=``) are stored by their ``state_dict()``. Without
    ``model``: load the resume file (or return None) and rescale ``step`` when the world size changed.

    Quirks kept on purpose (lesson 15 §8): the resume file holds the model in fp16, so resuming is
    not exact; ``torch.load`` relies on the library default (``weights_only=True`` since torch 2.6).
    """
    os.makedirs(save_dir, exist_ok=True)
    moe_path = "_moe" if lm_config.use_moe else ""
    ckp_path = f"{save_dir}/{weight}_{lm_config.hidden_size}{moe_path}.pth"
    resume_path = f"{save_dir}/{weight}_{lm_config.hidden_size}{moe_path}_resume.pth"
    if model is not None:
        state_dict = fp16_state_dict(model)
        ckp_tmp = ckp_path + ".tmp"
        torch.save(state_dict, ckp_tmp)
        os.replace(ckp_tmp, ckp_path)
        resume_data = {"model": state_dict, "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
                       "world_size": current_world_size()}
        for key, value in kwargs.items():
            if value is not None:
                resume_data[key] = value.state_dict() if hasattr(value, "state_dict") else value
        resume_tmp = resume_path + ".tmp"
        torch.save(resume_data, resume_tmp)
        os.replace(resume_tmp, resume_path)
        return None
    if not os.path.exists(resume_path):
        return None
    ckp_data = torch.load(resume_path, map_location="cpu")
    saved_ws = ckp_data.get("world_size", 1)
    current_ws = current_world_size()
    if saved_ws != current_ws:
        ckp_data["step"] = ckp_data["step"] * saved_ws // current_ws
        Logger(f"world size changed ({saved_ws} -> {current_ws}): step rescaled to {ckp_data['step']}")
    return ckp_data
