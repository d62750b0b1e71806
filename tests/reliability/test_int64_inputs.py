"""int64 user inputs (torch's default integer dtype: token ids) run on the device as int32.

Lowering gives an int64 user input the device dtype int32 and records that the caller passes
int64 (`graph.input_host_dtypes`). A call still requires int64, as compiled; it checks that every
value fits int32 (else InputValueError naming the input and the range of the values given) and
uploads an int32 copy. CPU fallbacks read the caller's int64 tensor (their fx node was traced on
int64, so type promotion and overflow stay torch's), and an input returned as an output comes
back as the caller's int64 tensor.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import texelflow
from texelflow import InputValueError


class Embed(nn.Module):
    """An embedding of int64 ids, optionally returning the ids and an int64 product of them."""

    def __init__(self, extra: str = ""):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.extra = extra

    def forward(self, ids):
        x = self.emb(ids) * 2.0
        if self.extra == "ids":
            return x, ids
        if self.extra == "wide":  # int64 arithmetic beyond int32's range: a CPU fallback
            return x, ids * 4_000_000_000
        return x


def ids_of(*shape, vocab=11, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def embed_prog(device):
    torch.manual_seed(0)
    model = Embed().eval()
    prog = texelflow.compile(model, (ids_of(2, 5),), device=device)
    yield prog, model
    prog.close()


def test_int64_ids_run_on_the_device(embed_prog):
    prog, model = embed_prog
    assert prog.plan.fallbacks == []
    assert prog.plan.dispatches["embedding"] == 1
    assert [v.dtype for v in prog.plan.graph.inputs] == ["int32"]
    ids = ids_of(2, 5, seed=3)
    got = prog(ids)
    with torch.no_grad():
        want = model(ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad,low,high", [(2**31, 0, 2**31), (-(2**31) - 1, -(2**31) - 1, 0)])
def test_value_out_of_int32_range_names_the_input(embed_prog, bad, low, high):
    prog, _ = embed_prog
    ids = torch.zeros(2, 5, dtype=torch.int64)
    ids[1, 2] = bad
    with pytest.raises(InputValueError) as info:
        prog(ids)
    assert str(info.value) == (
        f"input 0 (ids): int64 values must lie in [-2147483648, 2147483647] (the program runs this "
        f"input as int32 on the device), got values in [{low}, {high}]")


def test_caller_still_passes_int64(embed_prog):
    prog, _ = embed_prog
    with pytest.raises(InputValueError, match=r"input 0 \(ids\): expected dtype int64, got int32"):
        prog(ids_of(2, 5).to(torch.int32))


def test_int32_limits_are_accepted(device):
    """The extreme int32 values pass the check (a model that only returns the ids reads them all)."""
    model = Embed("ids").eval()
    ids = ids_of(3, 4)
    with texelflow.compile(model, (ids,), device=device) as prog:
        edge = ids.clone()
        edge[0, 0], edge[0, 1] = 2**31 - 1, -(2**31)
        _, back = prog(edge)
    assert back.dtype == torch.int64 and torch.equal(back, edge)


def test_returned_input_comes_back_int64_and_equal(device):
    model = Embed("ids").eval()
    ids = ids_of(3, 4)
    with texelflow.compile(model, (ids,), device=device) as prog:
        assert prog.plan.fallbacks == []
        other = ids_of(3, 4, seed=5)
        x, back = prog(other)
    assert back.dtype == torch.int64 and torch.equal(back, other)
    with torch.no_grad():
        torch.testing.assert_close(x, model(other)[0], rtol=0, atol=1e-6)


def test_cpu_fallback_reads_the_callers_int64_tensor(device):
    """ids * 4e9 exceeds int32: exact only because the CPU node gets the int64 tensor, not the
    int32 copy the device reads (int32 arithmetic would wrap)."""
    model = Embed("wide").eval()
    ids = ids_of(2, 3)
    with texelflow.compile(model, (ids,), device=device) as prog:
        assert [name for name, _ in prog.plan.fallbacks] == ["mul_1"]
        x, wide = prog(ids)
    with torch.no_grad():
        want_x, want_wide = model(ids)
    assert wide.dtype == torch.int64 and torch.equal(wide, want_wide)
    torch.testing.assert_close(x, want_x, rtol=0, atol=1e-6)


class Shifted(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 4)

    def forward(self, ids):
        return self.emb(ids + 1)


def test_computed_int64_values_run_in_int32_under_a_checked_input_bound(device):
    """`ids + 1` of an int64 input known only to fit int32 may not fit: lowering assumes the input
    lies in [-2^24, 2^24] (lowering._with_input_bounds), so the sum is bounded and runs in int32 on
    the device with the embedding; the plan says so, and a call outside the range is refused."""
    model, ids = Shifted().eval(), ids_of(2, 3, vocab=10)
    with texelflow.compile(model, (ids,), device=device) as prog:
        plan = prog.plan
        dtypes = {v.name: v.dtype for v in plan.graph.values()}
        assert dtypes["ids"] == "int32" and dtypes["add"] == "int32" and plan.fallbacks == []
        assert plan.graph.input_bounds == {"ids": (-2**24, 2**24)}
        assert "ids in [-16777216, 16777216]" in plan.summary()
        assert torch.equal(prog(ids), model(ids))
        with pytest.raises(InputValueError, match=r"must lie in \[-16777216, 16777216\]"):
            prog(torch.full_like(ids, 2**24 + 1))


def test_an_example_past_the_bounds_keeps_its_int64_arithmetic_on_the_cpu():
    """The example's own values bound the assumption from below: ids past 2^24 in the example keep
    `ids + 1` on the CPU, on int64 (no input bound the example itself would break)."""
    plan = texelflow.plan(Shifted().eval(), (torch.tensor([[3, 2**25]]),))
    assert plan.graph.input_bounds == {}
    assert [name for name, _ in plan.fallbacks] == ["add", "embedding"]


class Compare(nn.Module):
    """ids compared with a number, or with an int64 buffer (narrowed when every value fits)."""

    def __init__(self, number=None, buffer=None):
        super().__init__()
        self.number = number
        self.register_buffer("special", torch.tensor(buffer if buffer is not None else [0], dtype=torch.int64))

    def forward(self, ids):
        other = self.number if self.number is not None else self.special
        return (ids == other).float() + (ids > other).float(), self.special


@pytest.mark.parametrize("number", [2**31, 3e9, -(2**31) - 1])
def test_number_outside_int32_sends_its_node_to_the_cpu(device, number):
    """ids > 3_000_000_000 on int32 data would compare wrapped values: such a node runs on the CPU,
    on the caller's int64 tensor, with its reason."""
    ids = torch.tensor([[0, 5, -7], [2**31 - 1, -(2**31), 3]])
    model = Compare(number=number).eval()
    with texelflow.compile(model, (ids,), device=device) as prog:
        reasons = dict(prog.plan.fallbacks)
        assert set(reasons) == {"eq", "gt"}
        assert reasons["gt"] == (f"the number {number!r} is outside int32, the dtype the device holds int64 "
                                 f"'ids' in (it runs on the CPU, on the int64 data)")
        got, _ = prog(ids)
    torch.testing.assert_close(got, model(ids)[0], rtol=0, atol=0)


def test_int64_buffer_that_fits_is_narrowed_and_returned_as_int64(device):
    ids = torch.tensor([[0, 5, 9], [7, 9, 3]])
    model = Compare(buffer=[9, 5, 3]).eval()
    with texelflow.compile(model, (ids,), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert {v.name: v.dtype for v in prog.plan.graph.constants}["b_special"] == "int32"
        got, special = prog(ids)
    want, _ = model(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert special is model.special  # a returned buffer is the live tensor, int64


def test_int64_buffer_beyond_int32_keeps_int64(device):
    ids = torch.tensor([[0, 5, 9], [7, 9, 3]])
    model = Compare(buffer=[9, 2**40, 3]).eval()
    with texelflow.compile(model, (ids,), device=device) as prog:
        assert {v.name: v.dtype for v in prog.plan.graph.constants}["b_special"] == "int64"
        assert {name for name, _ in prog.plan.fallbacks} == {"eq", "gt"}
        got, _ = prog(ids)
    torch.testing.assert_close(got, model(ids)[0], rtol=0, atol=0)


def test_mutated_int64_buffer_is_not_narrowed(device):
    """A buffer forward writes keeps int64 (its readers run on the CPU, on the live buffer)."""

    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.tensor([3], dtype=torch.int64))

        def forward(self, ids):
            self.seen.add_(1)
            return (ids == self.seen).float()

    ids = torch.tensor([[4, 5], [6, 4]])
    model, ref = Counter().eval(), Counter().eval()
    with texelflow.compile(model, (ids,), device=device) as prog:
        assert {v.name: v.dtype for v in prog.plan.graph.constants}["b_seen"] == "int64"
        for _ in range(2):
            torch.testing.assert_close(prog(ids), ref(ids), rtol=0, atol=0)
    assert torch.equal(model.seen, ref.seen)


def test_view_of_int64_ids_is_narrowed_too(device):
    """GPT-2 reads `input_ids.view(-1, T)`: the view moves the same checked values, so it is int32
    on the device as well, while a CPU node reading it and the returned view get int64."""

    class Viewed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 4)

        def forward(self, ids):
            flat = ids.view(-1, ids.shape[-1]).reshape(-1)
            return self.emb(flat), flat, flat * 4_000_000_000

    ids = ids_of(2, 3)
    model = Viewed().eval()
    with texelflow.compile(model, (ids,), device=device) as prog:
        assert [name for name, _ in prog.plan.fallbacks] == ["mul"]
        assert prog.plan.dispatches["embedding"] == 1
        got = prog(ids)
    with torch.no_grad():
        want = model(ids)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
    for g, w in zip(got[1:], want[1:]):
        assert g.dtype == torch.int64 and torch.equal(g, w)


def test_a_saved_program_keeps_its_input_bounds(device, tmp_path):
    """The input's assumed range travels in the file (format.md: Input `bounds`): the loaded program
    refuses a value outside it as the compiled one does."""
    model, ids = Shifted().eval(), ids_of(2, 3, vocab=10)
    with texelflow.compile(model, (ids,), device=device) as prog:
        prog.save(tmp_path / "shifted.tflow")
    with texelflow.load(tmp_path / "shifted.tflow", device=device) as loaded:
        assert torch.equal(torch.as_tensor(loaded(ids.numpy())), model(ids))
        with pytest.raises(InputValueError, match=r"outside \[-16777216, 16777216\]"):
            loaded(torch.full_like(ids, -2**24 - 1).numpy())


def test_narrowed_values_moved_by_the_permute_pass_come_back_int64(device):
    """The permute pass moves a permute past a slice into a new value: held narrowed as the value
    it moves, so the int64 result comes back int64 (it came back int32)."""
    ids = ids_of(5, 7)
    x = torch.randn(5, 7)

    class M(nn.Module):
        def forward(self, ids, x):
            return (ids + 1).permute(1, 0)[:, :2], x.topk(2, 0).indices

    with texelflow.compile(M(), (ids, x), device=device) as prog:
        assert prog.plan.fallbacks == [] and prog.plan.dispatches["permute_copy"] >= 1
        got, want = prog(ids, x), M()(ids, x)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.int64 and torch.equal(g, w)
