"""seams.snapshots: the weights kept on a doubling grid of steps for the held-out loss at equal
tokens, the same grid on every rank, joined into one GPT state per step."""

import torch

from seamkit.seams.snapshots import Snapshots, merge_ranks


def test_the_grid_doubles_and_keeps_at_most_its_count(tmp_path):
    """Planted fault this catches: snapshots off the grid kept after it doubled (the ranks of one
    arm would keep different steps, and no step would be common to them)."""
    snaps = Snapshots(tmp_path, 4)
    for step in range(1, 12):
        snaps.take("e2e", step, step / 10, lambda: {"w": torch.tensor([1.0])})
    assert [s["step"] for s in snaps.kept] == [4, 8] and snaps.g == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2e_4.pt", "e2e_8.pt"]
    again = Snapshots(tmp_path, 4)
    (tmp_path / "e2e_8.pt").unlink()  # deleted by the stopped run after its checkpoint
    again.restore(snaps.state())
    assert [s["step"] for s in again.kept] == [4] and again.g == 4


def test_ranks_shares_join_into_one_state_per_common_step(tmp_path):
    """Planted faults this catches: a step one rank did not keep joined (half a model); a rank's
    share missing from the joined state; the first rank's time instead of the slowest's."""
    shares = []
    for rank, name in enumerate(("a", "b")):
        s = Snapshots(tmp_path / f"r{rank}", 2)
        for step in (1, 2, 3, 4):
            s.take(f"local-rank{rank}", step, step + rank, lambda: {name: torch.tensor([float(step)])})
        shares.append(s.kept)
    assert [s["step"] for s in shares[0]] == [2, 4]
    merged = merge_ranks(tmp_path / "joined", "local", shares)
    assert [(m["step"], m["elapsed_s"]) for m in merged] == [(2, 3), (4, 5)]
    state = torch.load(merged[1]["path"], weights_only=True)
    assert state.keys() == {"a", "b"} and state["a"].item() == state["b"].item() == 4.0
    assert not list((tmp_path / "r0").iterdir())  # the ranks' files are gone
