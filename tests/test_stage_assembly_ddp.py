"""The stage assembly under torchrun (impl/train_pretrain_impl.py, lesson 14 §8 "Several processes: torchrun").

Two gloo processes with micro-batches of 4 must end with the weights of one process with micro-batches of 8:
rank r's micro-batch j holds every 2nd sample of the single process's micro-batch j (the same permutation, seeded
42 + epoch, sharded round-robin), DDP averages the two ranks' gradients, and every sample here has the same number
of real targets (no padding), so the mean of the two ranks' mean losses is the single process's mean loss. The
runs differ only by float reassociation. The DDP run stops after 9 micro-steps and resumes; it has 2 epochs
(set_epoch) and a tail flush in each (20 micro-steps per epoch, K = 3).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from course.checks.framework import expect_equal, expect_tensors_close
from tensorboard_events import expect_float32_close, tensorboard_scalars
from course.implementations import REPO_ROOT, load_module
from course.minimind import IGNORE_INDEX, TINY_CORPUS, PretrainDataset

pytestmark = pytest.mark.ddp

STAGE_PATH = REPO_ROOT / "impl" / "train_pretrain_impl.py"
MAX_SEQ_LEN = 32  # the tiny corpus's shortest text is 30 bytes: every sample is bos + 30 bytes + eos, no padding
RUN = ["--impl", "reference", "--preset", "tiny", "--max_seq_len", str(MAX_SEQ_LEN), "--hidden_size", "32",
       "--num_hidden_layers", "1", "--epochs", "2", "--accumulation_steps", "3", "--learning_rate", "5e-3",
       "--max_new_tokens", "4", "--log_interval", "100"]
PER_RANK_BATCH, WORLD_SIZE, STOP_AFTER = 4, 2, 9
# Measured max |diff| of the final weights: about 1e-7 (float reassociation through 14 AdamW updates); a rank
# training on its own gradients, or epoch 2 in epoch 1's order, moves weights by about lr = 5e-3.
ATOL, RTOL = 2e-5, 1e-4

# Runs the stage under torchrun and records, per rank, every call that writes a file and every no_sync().
DRIVER = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from course.implementations import REPO_ROOT, load_module

    calls = Path(os.environ["CALLS_LOG"] + os.environ["RANK"])

    def spy(owner, name, target_of, run=True):
        real = getattr(owner, name)
        def recording(*args, **kwargs):
            with open(calls, "a") as out:
                out.write(f"{name} {target_of(args)}\\n")
            return real(*args, **kwargs) if run else None
        setattr(owner, name, recording)

    stage = load_module(REPO_ROOT / "impl" / "train_pretrain_impl.py", "ddp_driver_stage")
    spy(torch, "save", lambda args: getattr(args[1], "name", args[1]))   # a path, or an open file (its fd)
    spy(os, "replace", lambda args: args[1])   # an atomic save's rename onto the target
    spy(Path, "write_text", lambda args: args[0])
    spy(stage, "plot_losses", lambda args: args[2], run=False)   # no matplotlib: the figure is test_stage_assembly's
    spy(DistributedDataParallel, "no_sync", lambda args: "")
    sys.exit(stage.main(sys.argv[1:]))
''')


def torchrun(tmp_path, *argv):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    # --standalone: a local rendezvous on a free port; OMP_NUM_THREADS=1 (torchrun's default for several
    # processes, which it otherwise announces on stderr); TMPDIR: torchrun's log folder goes with tmp_path
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", CALLS_LOG=str(tmp_path / "calls_rank"),
               TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(WORLD_SIZE), str(driver), *RUN, "--batch_size", str(PER_RANK_BATCH), *argv],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout


def single_process(stage, *argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = stage.main([*RUN, *argv])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ddp")
    ddp_out, single_out, resumed_out = tmp_path / "ddp", tmp_path / "single", tmp_path / "resumed"
    stopped = torchrun(tmp_path, "--stop_after", str(STOP_AFTER), "--out_dir", str(ddp_out),
                       "--metrics_json", str(ddp_out / "stopped.json"))
    resume_file = ddp_out / "pretrain_32_resume.pth"
    ddp_checkpoint = torch.load(resume_file, weights_only=True)
    finished = torchrun(tmp_path, "--resume", str(resume_file), "--out_dir", str(ddp_out),
                        "--metrics_json", str(ddp_out / "resumed.json"), "--tensorboard", str(tmp_path / "tb"))
    stage = load_module(STAGE_PATH, "test_stage_assembly_ddp_stage")
    code, single = single_process(stage, "--batch_size", str(PER_RANK_BATCH * WORLD_SIZE), "--out_dir",
                                  str(single_out), "--metrics_json", str(single_out / "m.json"))
    assert code == 0, single[-3000:]
    resumed_code, resumed = single_process(stage, "--batch_size", str(PER_RANK_BATCH), "--resume", str(resume_file),
                                           "--out_dir", str(resumed_out))
    return SimpleNamespace(
        ddp_weights=torch.load(ddp_out / "pretrain_32.pth", weights_only=True),
        single_weights=torch.load(single_out / "pretrain_32.pth", weights_only=True),
        ddp_metrics=json.loads((ddp_out / "resumed.json").read_text()),
        single_metrics=json.loads((single_out / "m.json").read_text()),
        ddp_checkpoint=ddp_checkpoint, stdout=stopped + finished, resumed_code=resumed_code, resumed=resumed,
        calls={rank: (tmp_path / f"calls_rank{rank}").read_text().splitlines() for rank in range(WORLD_SIZE)},
        ddp_out=ddp_out, tensorboard=tmp_path / "tb")


def test_premise_every_sample_has_the_same_number_of_targets():
    """Exact equality needs equal target counts per micro-batch (the loss is a mean over real targets)."""
    dataset = PretrainDataset(TINY_CORPUS, max_length=MAX_SEQ_LEN)
    counts = {int((dataset[i][1][1:] != IGNORE_INDEX).sum()) for i in range(len(dataset))}
    expect_equal("target counts per sample of the tiny corpus at max_seq_len 32", counts, {MAX_SEQ_LEN - 1})
    expect_equal("samples (divisible by 2 ranks x micro-batch 4: no padding sample, no partial batch)",
                 len(dataset) % (WORLD_SIZE * PER_RANK_BATCH), 0)


def test_two_ranks_stopped_and_resumed_equal_one_process_with_the_global_batch(runs):
    diff = max(float((runs.ddp_weights[k] - v).abs().max()) for k, v in runs.single_weights.items())
    print(f"final weights, 2 ranks x batch {PER_RANK_BATCH} (stop at {STOP_AFTER}, resume) vs 1 process x batch "
          f"{PER_RANK_BATCH * WORLD_SIZE}: max |diff| = {diff:.3e} (atol {ATOL:g}, rtol {RTOL:g})")
    expect_tensors_close("final weights: ACTUAL 2 ranks (DDP), EXPECTED 1 process with the global batch; hint: "
                         "gradients not averaged over ranks, set_epoch missing, or no_sync on a closing micro-step",
                         runs.ddp_weights, runs.single_weights, rtol=RTOL, atol=ATOL)


def test_logged_train_loss_is_the_mean_over_ranks(runs):
    """The resumed DDP run logs updates 4..14; each is the mean over both ranks (the global batch's loss)."""
    single = dict((update, loss) for update, loss in runs.single_metrics["train_loss"])
    ddp = runs.ddp_metrics["train_loss"]
    expect_equal("updates logged after the resume (9 micro-steps = 3 updates done; 7 per epoch)",
                 [update for update, _ in ddp], list(range(4, 15)))
    for update, loss in ddp:
        assert abs(loss - single[update]) <= 1e-5, (
            f"update {update}: train loss ACTUAL {loss!r} (DDP), EXPECTED {single[update]!r} (one process, global "
            "batch), tolerance 1e-5; hint: rank 0's loss alone is not the update's loss")


def writes(calls: list[str]) -> list[str]:
    return [call for call in calls if not call.startswith("no_sync")]


def test_only_rank_0_writes_files(runs):
    expect_equal("files written by rank 1", writes(runs.calls[1]), [])
    written = " ".join(writes(runs.calls[0]))
    for what in ("pretrain_32_resume.pth", "pretrain_32.pth", "stopped.json", "resumed.json", "pretrain_32_loss.png"):
        assert what in written, f"rank 0 should write {what}; ACTUAL writes: {writes(runs.calls[0])}"
    assert runs.stdout.count("saved weights to") == 1, f"log lines from more than one rank:\n{runs.stdout[-3000:]}"


def test_no_sync_on_every_micro_step_that_does_not_close_an_update(runs):
    """2 epochs of 20 micro-steps, K = 3: updates close at 3, 6, ..., 18 and the tail flush at 20, so 13
    micro-steps per epoch only accumulate (the equality above shows that the 7 closing ones do sync)."""
    for rank in range(WORLD_SIZE):
        expect_equal(f"rank {rank}: micro-steps run inside no_sync()",
                     sum(call.startswith("no_sync") for call in runs.calls[rank]), 2 * 13)


def test_ddp_checkpoint_holds_the_unwrapped_model_and_resumes_in_one_process(runs):
    keys = sorted(runs.ddp_checkpoint["model"])
    expect_equal("checkpoint keys with a DDP prefix", [k for k in keys if k.startswith("module.")], [])
    expect_equal("checkpoint keys", keys, sorted(runs.single_weights))
    expect_equal("checkpoint (world_size, epoch, step)",
                 tuple(runs.ddp_checkpoint[k] for k in ("world_size", "epoch", "step")), (WORLD_SIZE, 0, STOP_AFTER))
    expect_equal("single-process resume exit code", runs.resumed_code, 0)
    # 9 micro-steps of 2 x 4 samples = 18 micro-steps of 4 in one process (lesson 15's rescale)
    assert f"step {STOP_AFTER * WORLD_SIZE}/40" in runs.resumed, runs.resumed[-2000:]
    assert "the checkpoint was written by 2 processes, this run has 1" in runs.resumed, runs.resumed[-2000:]


def test_tensorboard_is_written_by_rank_0_counting_both_ranks_tokens(runs):
    """One event file (rank 0's); its train/loss is the metrics' (the mean over both ranks) from update 4 on. The
    resumed run trains two stretches, ending at updates 7 and 14: micro-steps 10-20 of epoch 1 and 1-20 of epoch 2,
    each of 2 ranks x 4 samples of 31 targets. Their seconds, tokens / tokens/s, must add up to the run's tokens/s
    of the metrics (every rank's tokens over rank 0's time): rank 0's tokens alone would make it half of that."""
    scalars = tensorboard_scalars(runs.tensorboard)
    expect_float32_close("train/loss", scalars["train/loss"], runs.ddp_metrics["train_loss"])
    per_micro_step = WORLD_SIZE * PER_RANK_BATCH * (MAX_SEQ_LEN - 1)
    tokens = {7: 11 * per_micro_step, 14: 20 * per_micro_step}
    expect_equal("updates of the tokens/s points", [step for step, _ in scalars["perf/tokens_per_second"]], [7, 14])
    seconds = sum(tokens[step] / rate for step, rate in scalars["perf/tokens_per_second"])
    run_rate = runs.ddp_metrics["tokens_per_second"]
    assert abs(sum(tokens.values()) / seconds - run_rate) <= 1e-5 * run_rate, (
        f"tokens/s ACTUAL {sum(tokens.values()) / seconds!r} from the TensorBoard points, EXPECTED the run's "
        f"{run_rate!r} (relative 1e-5: float32 points); hint: half of it is rank 0's tokens alone")
    ratios = [mfu / rate for (_, mfu), (_, rate) in zip(scalars["perf/mfu"], scalars["perf/tokens_per_second"])]
    run_ratio = runs.ddp_metrics["mfu"] / run_rate
    assert all(abs(r - run_ratio) <= 1e-6 * run_ratio for r in ratios), (
        f"MFU / tokens/s ACTUAL {ratios}, EXPECTED {run_ratio} at every point")
