"""`ferrio.safetensors.torch.save_model` / `load_model` against `safetensors.torch`'s: a module
whose tensors share memory (tied weights) saves each shared tensor once, in the same bytes, and
loads back with the same missing and unexpected names."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

import ferrio.safetensors.torch as fst  # noqa: E402
from ferrio.safetensors import safe_open  # noqa: E402


class Tied(torch.nn.Module):  # type: ignore[misc]
    """An embedding and an output projection that share one weight, as language models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):  # type: ignore[no-untyped-def]
        return self.head(self.norm(self.embed(ids)))


def tied(seed: int, device: str = "cpu") -> Tied:
    torch.manual_seed(seed)
    m = Tied().to(device).eval()
    with torch.no_grad():  # LayerNorm starts at ones and zeros: make every tensor random
        for p in m.parameters():
            p.normal_()
    return m


def outputs(model):  # type: ignore[no-untyped-def]
    ids = torch.arange(16, device=model.embed.weight.device).reshape(2, 8)
    with torch.no_grad():
        return model(ids)


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def test_save_model_writes_the_bytes_of_safetensors_and_records_the_tie(tmp_path):
    model = tied(0)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    fst.save_model(model, ours)
    st_torch.save_model(model, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    with safe_open(ours, "pt") as f:
        assert sorted(f.keys()) == ["embed.weight", "norm.bias", "norm.weight"]
        assert f.metadata() == {"head.weight": "embed.weight"}

    # The caller's metadata: its keys win over the tie's note, and the dict is not changed.
    mine = {"head.weight": "mine"}
    fst.save_model(model, ours, metadata=mine)
    st_torch.save_model(model, str(theirs), metadata=dict(mine))
    assert mine == {"head.weight": "mine"}
    assert ours.read_bytes() == theirs.read_bytes()
    # With two keys or more safetensors orders the metadata differently from process to
    # process (a hash map): the headers then agree as JSON, the tensor bytes as bytes.
    mine = {"format": "pt"}
    fst.save_model(model, ours, metadata=mine)
    st_torch.save_model(model, str(theirs), metadata=dict(mine))
    assert mine == {"format": "pt"}
    assert split(ours) == split(theirs)
    assert split(ours)[0]["__metadata__"] == {"format": "pt", "head.weight": "embed.weight"}


def split(path):  # type: ignore[no-untyped-def]
    """A safetensors file's header, parsed, and its data section."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("saver", ["ferrio", "safetensors"])
def test_load_model_restores_a_tied_module(tmp_path, saver, device):
    model = tied(0, device)
    path = tmp_path / "m.safetensors"
    (fst.save_model if saver == "ferrio" else st_torch.save_model)(model, str(path))
    fresh, theirs = tied(1, device), tied(1, device)
    # The fresh module's own weights give other outputs: equality below means they loaded.
    assert not torch.equal(outputs(fresh), outputs(model))
    got = fst.load_model(fresh, path, device=device)
    assert got == st_torch.load_model(theirs, str(path), device=device) == (set(), [])
    assert torch.equal(outputs(fresh), outputs(model))
    assert fresh.head.weight is fresh.embed.weight  # still tied


def test_load_model_reports_missing_and_unexpected_names_as_safetensors(tmp_path):
    model = tied(0)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "head.weight"}
    del state["norm.bias"]
    state["extra"] = torch.ones(3)
    path = tmp_path / "m.safetensors"
    st_torch.save_file(state, str(path))

    got = fst.load_model(tied(1), path, strict=False)
    want = st_torch.load_model(tied(1), str(path), strict=False)
    assert got == want and got == ({"norm.bias"}, ["extra"])
    both = r'(?s)Missing key.*"norm\.bias".*Unexpected key.*"extra"'
    with pytest.raises(RuntimeError, match=both):
        fst.load_model(tied(1), path)
    with pytest.raises(RuntimeError):
        st_torch.load_model(tied(1), str(path))


def test_load_model_takes_either_name_of_a_tie(tmp_path):
    """A file that kept the other name of the tie (`head.weight`) loads into the tied module."""
    model = tied(0)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "embed.weight"}
    path = tmp_path / "m.safetensors"
    st_torch.save_file(state, str(path))
    fresh = tied(1)
    assert fst.load_model(fresh, path) == st_torch.load_model(tied(1), str(path)) == (set(), [])
    assert torch.equal(outputs(fresh), outputs(model))


class Views(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, a, b) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.register_buffer("a", a)
        self.register_buffer("b", b)


def test_save_model_refuses_overlapping_views_that_cover_nothing_whole(tmp_path):
    base = torch.arange(8.0)
    model = Views(base[0:6], base[2:8])
    for save in (fst.save_model, st_torch.save_model):
        with pytest.raises(RuntimeError):
            save(model, str(tmp_path / "x.safetensors"))
    assert not (tmp_path / "x.safetensors").exists()


def test_save_model_saves_disjoint_views_and_non_contiguous_tensors(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    model = Views(base[:1], base.t())  # a view of part of the storage; a transposed whole
    with pytest.raises(ValueError, match="force_contiguous=True"):
        fst.save_model(model, tmp_path / "x.safetensors", force_contiguous=False)
    assert not (tmp_path / "x.safetensors").exists()
    # a and b overlap; b covers the whole storage, so it is kept and a left out.
    fst.save_model(model, tmp_path / "x.safetensors")
    with safe_open(tmp_path / "x.safetensors", "pt") as f:
        assert list(f.keys()) == ["b"] and f.metadata() == {"a": "b"}
        assert torch.equal(f.get_tensor("b"), base.t())
    lone = Views(base[:1].clone(), base[1:2])  # b: one row of base, shared with nothing saved
    fst.save_model(lone, tmp_path / "y.safetensors")
    assert torch.equal(fst.load_file(tmp_path / "y.safetensors")["b"], base[1:2])


@pytest.mark.parametrize("names", [[], ["embed.weight", "head.weight"]])
def test_load_model_reports_a_tie_as_one_name(tmp_path, names):
    """A file with neither name of the tie reports one missing; one with both, one unexpected."""
    model = tied(0)
    state = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("norm.")}
    state.update({k: model.state_dict()[k].clone() for k in names})
    path = tmp_path / "m.safetensors"
    st_torch.save_file(state, str(path))
    got = fst.load_model(tied(1), path, strict=False)
    assert got == st_torch.load_model(tied(1), str(path), strict=False)
    assert got == (({"embed.weight"}, []) if not names else (set(), ["head.weight"]))


def test_load_model_from_a_truncated_file_raises_and_leaves_the_module_as_it_was(tmp_path):
    path = tmp_path / "m.safetensors"
    fst.save_model(tied(0), path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 100])  # the last tensor's bytes cut short
    fresh = tied(1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(fst.SafetensorError):
        fst.load_model(fresh, path)
    after = fresh.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


class Stack(torch.nn.Module):  # type: ignore[misc]
    """Four layers of one size: a checkpoint of them splits into shards of equal size."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))


def stack(seed: int, device: str = "cpu") -> Stack:
    torch.manual_seed(seed)
    return Stack().to(device)


def save_shards(model: Stack, root) -> list[str]:  # type: ignore[no-untyped-def]
    """One shard per layer, named as transformers names them, and their index."""
    state = model.state_dict()
    paths, weight_map = [], {}
    for i in range(4):
        name = f"model-0000{i + 1}-of-00004.safetensors"
        part = {k: v.clone() for k, v in state.items() if k.startswith(f"layers.{i}.")}
        st_torch.save_file(part, str(root / name))
        weight_map.update(dict.fromkeys(part, name))
        paths.append(str(root / name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return paths


def test_load_model_loads_shards_one_file_at_a_time(tmp_path, monkeypatch):
    """Each `load_state_dict` call gets one shard's tensors, so one shard's buffer is held at a
    time; the result equals a loop of safetensors' load_model over the shards."""
    model = stack(0)
    paths = save_shards(model, tmp_path)
    fresh, theirs = stack(1), stack(1)
    calls: list[list[str]] = []
    real = Stack.load_state_dict

    def recording(self, state, strict=True):  # type: ignore[no-untyped-def]
        calls.append(sorted(state))
        return real(self, state, strict=strict)

    monkeypatch.setattr(Stack, "load_state_dict", recording)
    assert fst.load_model(fresh, tmp_path / "model.safetensors.index.json") == (set(), [])
    assert calls == [[f"layers.{i}.bias", f"layers.{i}.weight"] for i in range(4)]
    monkeypatch.undo()
    for p in paths:
        st_torch.load_model(theirs, p, strict=False)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v) and torch.equal(theirs.state_dict()[k], v)


def test_load_model_over_shards_reports_names_no_shard_has(tmp_path):
    model = stack(0)
    save_shards(model, tmp_path)
    extra = {"layers.4.weight": torch.ones(2)}
    st_torch.save_file(extra, str(tmp_path / "model-00005-of-00005.safetensors"))
    (tmp_path / "model.safetensors.index.json").unlink()  # the directory: all five files
    (tmp_path / "model-00002-of-00004.safetensors").unlink()
    got = fst.load_model(stack(1), tmp_path, strict=False)
    assert got == ({"layers.1.bias", "layers.1.weight"}, ["layers.4.weight"])
    with pytest.raises(RuntimeError, match=r'(?s)"layers\.1\.bias".*"layers\.4\.weight"'):
        fst.load_model(stack(1), tmp_path)


def test_load_model_from_a_truncated_shard_leaves_every_shard_unloaded(tmp_path):
    """Sizes are checked at open, before any shard is copied in: a short last shard fails the
    load with the module as it was."""
    paths = save_shards(stack(0), tmp_path)
    last = tmp_path / paths[-1]
    last.write_bytes(last.read_bytes()[:-10])
    fresh = stack(1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(fst.SafetensorError):
        fst.load_model(fresh, tmp_path / "model.safetensors.index.json")
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_model_onto_the_gpu_holds_one_shard_beside_the_module(tmp_path):
    torch.manual_seed(0)
    big = torch.nn.ModuleList(torch.nn.Linear(2048, 2048, bias=False) for _ in range(4))
    for i, layer in enumerate(big):  # 16 MiB a shard
        path = str(tmp_path / f"{i}.safetensors")
        st_torch.save_file({f"{i}.weight": layer.weight.detach()}, path)
    model = torch.nn.ModuleList(torch.nn.Linear(2048, 2048, bias=False) for _ in range(4)).cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    assert fst.load_model(model, tmp_path, device="cuda") == (set(), [])
    shard = 2048 * 2048 * 4
    assert torch.cuda.max_memory_allocated() - base <= shard + (2 << 20)
    for a, b in zip(model, big, strict=True):
        assert torch.equal(a.weight.cpu(), b.weight.detach())


def test_load_model_refuses_a_dtype_torch_lacks_in_a_later_shard_before_loading_any(tmp_path):
    paths = save_shards(stack(0), tmp_path)
    last = tmp_path / paths[-1]
    raw = last.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    # The same 256 bytes as F4 (two 4-bit floats a byte), which this torch has no dtype for.
    header["layers.3.bias"].update(dtype="F4", shape=[512])
    text = json.dumps(header).encode()
    last.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    fresh = stack(1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(TypeError, match="F4"):
        fst.load_model(fresh, tmp_path / "model.safetensors.index.json")
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
