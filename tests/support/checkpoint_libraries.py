"""The checkpoint libraries training jobs save with, each saving a small checkpoint as its users do
and loading it back: ``python checkpoint_libraries.py LIBRARY DIR save|load`` (exit 0 when what was
loaded is what was saved). The states are made from fixed seeds, so a load in a fresh process knows
what it must find, and a direct save and one under `monarch run` write the same bytes (apart from
the timestamps a library writes, IGNORED)."""

from __future__ import annotations

import os
import sys

# files whose bytes hold the time of their save (compared by name only)
IGNORED = {"orbax": ("",), "dcp": (".metadata",),  # (a save's random id)
           "trainer": ("trainer_state.json", "training_args.bin"), "lightning": (".ckpt",)}
# names a library draws at random (tensorstore's data files): compared by the directories holding some
RANDOM_NAMES = {"orbax": r"[0-9a-f]{32}"}
LIBRARIES = ("safetensors", "h5py", "megatron", "dcp", "orbax", "lightning", "trainer")


def state(step: int):
    """A model's state at ``step``: 170 KB, or larger by CHECKPOINT_EMBED_ROWS (rows of 512 bytes;
    the benchmarks' checkpoints of a realistic size)."""
    import torch
    g = torch.Generator().manual_seed(step)
    rows = int(os.environ.get("CHECKPOINT_EMBED_ROWS", "256"))
    return {"embed.weight": torch.randn(rows, 128, generator=g), "head.weight": torch.randn(64, 128, generator=g),
            "head.bias": torch.randn(64, generator=g), "step": torch.tensor(step)}


def same(a: dict, b: dict) -> None:
    import torch
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        assert torch.equal(a[k], b[k]), k


# ---- safetensors: save_file (a temporary renamed by a raw system call) -----------------------------
def safetensors_save(d: str) -> None:
    from safetensors.torch import save_file
    for step in (1, 2):
        save_file(state(step), os.path.join(d, "model.safetensors"))


def safetensors_load(d: str) -> None:
    from safetensors.torch import load_file
    same(load_file(os.path.join(d, "model.safetensors")), state(2))


# ---- h5py ----------------------------------------------------------------------------------------
def h5py_save(d: str) -> None:
    import h5py
    with h5py.File(os.path.join(d, "weights.h5"), "w") as f:
        for k, v in state(3).items():
            f.create_dataset(k, data=v.numpy())


def h5py_load(d: str) -> None:
    import h5py
    import torch
    with h5py.File(os.path.join(d, "weights.h5"), "r") as f:
        same({k: torch.as_tensor(f[k][()]) for k in f}, state(3))


# ---- a Megatron-style tracker: each iteration's shards, then the tracker naming it -----------------
def megatron_save(d: str) -> None:
    import torch
    for it in (100, 200):
        shard = os.path.join(d, f"iter_{it:07d}", "mp_rank_00")
        os.makedirs(shard, exist_ok=True)
        torch.save({"model": state(it), "iteration": it}, os.path.join(shard, "model_optim_rng.pt"))
        with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(it))


def megatron_load(d: str) -> None:
    import torch
    with open(os.path.join(d, "latest_checkpointed_iteration.txt")) as f:
        it = int(f.read())
    ck = torch.load(os.path.join(d, f"iter_{it:07d}", "mp_rank_00", "model_optim_rng.pt"))
    assert it == 200 and ck["iteration"] == it
    same(ck["model"], state(it))


# ---- torch.distributed.checkpoint with its defaults (FileSystemWriter: every file fsynced) ---------
def dcp_save(d: str) -> None:
    import torch.distributed.checkpoint as dcp
    for step in (1, 2):
        dcp.save(state(step), checkpoint_id=os.path.join(d, f"step{step}"))


def dcp_load(d: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    for step in (1, 2):
        got = {k: torch.zeros_like(v) for k, v in state(step).items()}
        dcp.load(got, checkpoint_id=os.path.join(d, f"step{step}"))
        same(got, state(step))


# ---- orbax's CheckpointManager (tensorstore underneath), two kept of four ----------------------------
def _orbax_tree(step: int):
    return {k: v.numpy() for k, v in state(step).items()}


def orbax_save(d: str) -> None:
    import orbax.checkpoint as ocp
    with ocp.CheckpointManager(os.path.join(d, "ckpts"), options=ocp.CheckpointManagerOptions(max_to_keep=2)) as m:
        for step in range(4):
            m.save(step, args=ocp.args.StandardSave(_orbax_tree(step)))
        m.wait_until_finished()


def orbax_load(d: str) -> None:
    import numpy as np
    import orbax.checkpoint as ocp
    with ocp.CheckpointManager(os.path.join(d, "ckpts")) as m:
        assert list(m.all_steps()) == [2, 3], m.all_steps()
        got = m.restore(3, args=ocp.args.StandardRestore(_orbax_tree(3)))
    for k, v in _orbax_tree(3).items():
        assert np.array_equal(got[k], v), k


# ---- Lightning's ModelCheckpoint, every epoch, save_last as a symlink -----------------------------------
def _lightning_module():
    import lightning as L
    import torch

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(16, 4)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    return Tiny


def lightning_save(d: str) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g))
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=d,
                        callbacks=[ModelCheckpoint(dirpath=os.path.join(d, "ckpt"), save_top_k=-1,
                                                   every_n_epochs=1, save_last="link")])
    trainer.fit(_lightning_module()(), torch.utils.data.DataLoader(data, batch_size=16))
    torch.save(trainer.lightning_module.state_dict(), os.path.join(d, "final.pt"))


def lightning_load(d: str) -> None:
    import torch
    last = os.path.join(d, "ckpt", "last.ckpt")
    assert os.path.islink(last), "last.ckpt is not a symlink"
    ck = torch.load(last, weights_only=False)
    assert ck["epoch"] == 1, ck["epoch"]
    same(ck["state_dict"], torch.load(os.path.join(d, "final.pt")))


# ---- a Hugging Face Trainer: safetensors saves every 10 steps, two kept, then a job that resumes -----
def _trainer(d: str, max_steps: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 64, (64, 16), generator=g)
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(output_dir=d, max_steps=max_steps, save_steps=10, save_total_limit=2,
                             per_device_train_batch_size=8, report_to=[], use_cpu=True, logging_strategy="no",
                             disable_tqdm=True, seed=0, data_seed=0, dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=data)


def trainer_save(d: str) -> None:
    _trainer(d, 30).train()
    _trainer(d, 40).train(resume_from_checkpoint=True)  # the next job of the same run: from checkpoint-30


def trainer_load(d: str) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel
    kept = sorted(n for n in os.listdir(d) if n.startswith("checkpoint-"))
    assert kept == ["checkpoint-30", "checkpoint-40"], kept
    model = GPT2LMHeadModel.from_pretrained(os.path.join(d, "checkpoint-40"))
    same({k: v for k, v in model.state_dict().items() if "attn.bias" not in k and k != "lm_head.weight"},
         {k: v for k, v in load_file(os.path.join(d, "checkpoint-40", "model.safetensors")).items()
          if "attn.bias" not in k and k != "lm_head.weight"})
    assert torch.load(os.path.join(d, "checkpoint-40", "rng_state.pth"), weights_only=False)


def trainer_resume(d: str) -> None:
    """The job after the save: resumes from checkpoint-40 (its first step the 41st) and trains to 50."""
    from transformers import TrainerCallback
    steps = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            steps.append(state.global_step)
    trainer = _trainer(d, 50)
    trainer.add_callback(Steps())
    trainer.train(resume_from_checkpoint=True)
    assert steps == list(range(41, 51)), steps


def main(argv: list[str]) -> int:
    library, d, what = argv
    os.makedirs(d, exist_ok=True)
    globals()[f"{library}_{what}"](d)
    print(f"{library} {what}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
