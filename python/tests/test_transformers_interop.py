"""A small `transformers` model (built from a config, random weights, nothing downloaded) saved
with `save_pretrained` loads its state dict through `ferrio.safetensors` — one file and shards
with an index — bit-identical to `safetensors.torch`, and gives the same outputs."""

from __future__ import annotations

import inspect
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st_torch = pytest.importorskip("safetensors.torch")

import ferrio.safetensors.torch as fst  # noqa: E402


def tiny_llama(seed: int, tie: bool = False):  # type: ignore[no-untyped-def]
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def save(model, path, **kwargs) -> None:  # type: ignore[no-untyped-def]
    # transformers 5 always writes safetensors and dropped the keyword; 4.x needs it.
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    model.save_pretrained(path, **kwargs)


def logits(model):  # type: ignore[no-untyped-def]
    ids = torch.arange(24).reshape(2, 12) % 128
    with torch.no_grad():
        return model(input_ids=ids).logits


def same_tensors(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


def check_loads_into_a_fresh_model(original, state: dict) -> None:  # type: ignore[no-untyped-def]
    fresh = tiny_llama(seed=1)
    expected = logits(original)
    # The fresh model's own random weights give other outputs, so equality below means the
    # loaded weights were used.
    assert not torch.equal(logits(fresh), expected)
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(logits(fresh), expected)


def test_single_file_model_loads_and_gives_identical_outputs(tmp_path):
    model = tiny_llama(seed=0)
    save(model, tmp_path)
    path = tmp_path / "model.safetensors"
    assert path.exists(), sorted(p.name for p in tmp_path.iterdir())
    state = fst.load_file(path)
    same_tensors(state, st_torch.load_file(path))
    same_tensors(state, {k: v.contiguous() for k, v in model.state_dict().items()})
    check_loads_into_a_fresh_model(model, state)


@pytest.mark.parametrize("how", ["directory", "index"])
def test_sharded_model_loads_and_gives_identical_outputs(tmp_path, how):
    model = tiny_llama(seed=0)
    save(model, tmp_path, max_shard_size="100KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.exists(), sorted(p.name for p in tmp_path.iterdir())
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    assert len(shards) >= 2, shards
    state = fst.load_file(tmp_path if how == "directory" else index)
    expected = {}
    for shard in shards:
        expected.update(st_torch.load_file(tmp_path / shard))
    same_tensors(state, expected)
    check_loads_into_a_fresh_model(model, state)


def test_bf16_model_round_trips_through_ferrio_save_file(tmp_path):
    model = tiny_llama(seed=0).to(torch.bfloat16)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    fst.save_file(state, ours, metadata={"format": "pt"})
    st_torch.save_file(state, theirs, metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    fresh = tiny_llama(seed=1).to(torch.bfloat16)
    fresh.load_state_dict(fst.load_file(ours), strict=True)
    assert torch.equal(logits(fresh), logits(model))


@pytest.mark.parametrize("sharded", [False, True])
def test_model_loads_onto_the_gpu(tmp_path, sharded):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = tiny_llama(seed=0)
    save(model, tmp_path, **({"max_shard_size": "100KB"} if sharded else {}))
    state = fst.load_file(tmp_path, device="cuda:0")
    assert all(t.is_cuda for t in state.values())
    expected = {}
    for shard in sorted(tmp_path.glob("*.safetensors")):
        expected.update(st_torch.load_file(shard, device="cuda:0"))
    same_tensors(state, expected)
    # The outputs are compared on the CPU, where the kernels are the same for both models.
    check_loads_into_a_fresh_model(model, {k: v.cpu() for k, v in state.items()})


def test_tied_model_saves_and_loads_with_save_model_and_load_model(tmp_path):
    """The output projection tied to the embedding: `save_model` writes it once, in the bytes
    `safetensors.torch.save_model` writes, and `load_model` restores both names; a file
    `save_pretrained` wrote (it keeps the embedding's name) loads as well."""
    model = tiny_llama(seed=0, tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    fst.save_model(model, ours)
    st_torch.save_model(model, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    save(model, tmp_path / "pretrained")
    for path in (ours, tmp_path / "pretrained" / "model.safetensors"):
        fresh, other = tiny_llama(seed=1, tie=True), tiny_llama(seed=1, tie=True)
        assert not torch.equal(logits(fresh), logits(model))
        got = fst.load_model(fresh, path)
        assert got == st_torch.load_model(other, str(path)) == (set(), []), path
        assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
        assert torch.equal(logits(fresh), logits(model)), path
