"""Training that changes shape: a job's position is one global index per
epoch, saved by the trainer, and a job submitted with `resume=` that
state continues the same global order with another world size, batch
size or number of DataLoader workers, also after `serve` was killed.

The proof in each test: the samples the trainer took, in the order it
took them (step by step, each step's batches in global position order),
equal the epoch's order as one rank reading it whole gives it."""

import pytest
from torch.utils.data import DataLoader as PlainLoader

import sluice
from serve import generate, sample_server, serve_env, serving

SQL = "SELECT key, label FROM pets"
SHUFFLE = {"seed": 11, "mode": "full"}


@pytest.fixture(scope="module")
def server():
    with sample_server(3, 31) as (_, c, _, _):  # 93 samples: no shape divides them
        yield c


def epoch_order(c, epoch=0, shuffle=SHUFFLE):
    job = c.submit(SQL, batch_size=7, epochs=epoch + 1, shuffle=shuffle)
    return [k for b in job.reader(0, epoch, numpy=True) for k in b["key"]]


def run_shape(c, world, batch, workers, steps, resume=None, epochs=1):
    """`world` ranks, each a sluice DataLoader with `workers` workers,
    taking `steps` batches in lockstep (None: to the end of the epoch).
    Returns (the samples taken in global order, every rank's state)."""
    opts = {"resume": resume} if resume else {}
    job = c.submit(SQL, batch_size=batch, world_size=world, epochs=epochs, shuffle=SHUFFLE,
                   **opts)
    job.wait()
    loaders = [sluice.torch.DataLoader(sluice.torch.Dataset(job, rank=r), num_workers=workers,
                                       timeout=120 if workers else 0)
               for r in range(world)]
    iters = [iter(dl) for dl in loaders]
    taken = []
    step = 0
    while steps is None or step < steps:
        batches = [next(it, None) for it in iters]
        if all(b is None for b in batches):
            break
        rows = max(len(b["key"]) for b in batches if b is not None)
        for i in range(rows):  # position s + i*world + r
            for b in batches:
                if b is not None and i < len(b["key"]):
                    taken.append(b["key"][i])
        step += 1
    states = [dl.state_dict() for dl in loaders]
    del iters
    return taken, states


@pytest.mark.parametrize("workers", [0, 2])
def test_world_4_to_2_to_8_mid_epoch_reads_the_global_order_once(server, workers):
    whole = epoch_order(server)
    assert len(whole) == 93 and len(set(whole)) == 93
    taken, states = run_shape(server, 4, 5, workers, steps=2)
    assert all(s == states[0] for s in states), states
    assert states[0]["position"] == 2 * 5 * 4 and states[0]["epoch"] == 0
    more, states = run_shape(server, 2, 5, workers, steps=3, resume=states[0])
    assert states[0]["position"] == 40 + 3 * 5 * 2
    rest, states = run_shape(server, 8, 5, workers, steps=None, resume=states[0])
    got = taken + more + rest
    # The last step pads (drop_last is off): the epoch's first samples again.
    assert got[:93] == whole
    assert got[93:] == whole[:len(got) - 93]
    assert states[0] == {"sluice": 1, "epoch": 1, "position": 0, "samples": 93,
                         "shuffle": states[0]["shuffle"]}


def test_batch_size_and_workers_change_at_resume(server):
    whole = epoch_order(server)
    taken, states = run_shape(server, 3, 4, 0, steps=3)
    assert states[0]["position"] == 36
    rest, _ = run_shape(server, 2, 9, 3, steps=None, resume=states[0])
    assert (taken + rest)[:93] == whole


def test_a_later_epoch_resumes_and_the_next_follows_the_new_shape(server):
    e1 = epoch_order(server, 1)
    e2 = epoch_order(server, 2)
    state = server.submit(SQL, batch_size=4, world_size=2, epochs=3,
                          shuffle=SHUFFLE).state_dict(1, 12)
    assert state["epoch"] == 1 and state["position"] == 24
    job = server.submit(SQL, batch_size=6, world_size=3, epochs=3, shuffle=SHUFFLE,
                        resume=state)
    st = job.wait()
    assert st["resumed"] == {"epoch": 1, "start": 24, "samples_per_rank": 23}
    ranks = [[k for b in job.reader(r, 1, numpy=True) for k in b["key"]] for r in range(3)]
    merged = [ranks[r][i] for i in range(23) for r in range(3)]
    assert merged[:93 - 24] == e1[24:]
    ranks = [[k for b in job.reader(r, 2, numpy=True) for k in b["key"]] for r in range(3)]
    assert [ranks[r][i] for i in range(31) for r in range(3)] == e2
    with pytest.raises(sluice.SluiceError, match="resumes a training at epoch 1"):
        list(job.reader(0, 0))


def test_a_state_saved_without_workers_restores_with_workers(server):
    """The Dataset's own state (read whole) is the global position: a
    same-shape job read on by 2 workers continues it."""
    whole = epoch_order(server)
    job = server.submit(SQL, batch_size=5, shuffle=SHUFFLE)
    ds = sluice.torch.Dataset(job)
    seen = []
    for i, b in enumerate(PlainLoader(ds, batch_size=None)):
        seen.extend(b["key"])
        if i == 3:
            break
    state = ds.state_dict()
    assert state["position"] == 20 and state["offset"] == 20
    again = sluice.torch.Dataset(job)
    loader = sluice.torch.DataLoader(again, num_workers=2, timeout=120)
    loader.load_state_dict(state)
    rest = [k for b in loader for k in b["key"]]
    assert seen + rest == whole
    assert loader.state_dict()["epoch"] == 1


def test_resume_refuses_what_it_cannot_continue(server):
    state = server.submit(SQL, batch_size=4, shuffle=SHUFFLE).state_dict(0, 8)
    with pytest.raises(sluice.SluiceError, match="shuffle seed 11.*seed 12"):
        server.submit(SQL, batch_size=4, shuffle={"seed": 12}, resume=state)
    with pytest.raises(sluice.SluiceError, match="past the job's epochs"):
        server.submit(SQL, batch_size=4, shuffle=SHUFFLE, resume=dict(state, epoch=3))
    with pytest.raises(sluice.SluiceError, match="unknown field"):
        server.submit(SQL, batch_size=4, shuffle=SHUFFLE, resume=dict(state, offset=3))
    # Another sample count: another order, so the position means nothing.
    job = server.submit(SQL + " WHERE label <> 'class_0'", batch_size=4, shuffle=SHUFFLE,
                        resume=state)
    st = job.wait()
    assert st["state"] == "failed" and "93 samples" in st["error"], st
    # A worker's own state says nothing of its rank's other workers.
    job = server.submit(SQL, batch_size=4, shuffle=SHUFFLE)
    ds = sluice.torch.Dataset(job)
    ds.load_state_dict({"epoch": 0, "offset": 8, "worker": 0, "workers": 2})
    with pytest.raises(ValueError, match="as many workers"):
        next(iter(PlainLoader(ds, batch_size=None)))


def test_resume_after_serve_is_killed(tmp_path):
    """The trainer's state dict, taken before kill -9, resumes on the
    restarted server with another world size: the rest exactly."""
    d = str(tmp_path)
    env = serve_env(d)
    src = generate(d, env, "pets", 3, 20)
    with serving(d, env, kill=True) as c:
        c.ingest("pets", src)
        whole = epoch_order(c)
        taken, states = run_shape(c, 2, 4, 0, steps=3)
        assert states[0]["position"] == 24
    with serving(d, env) as c:
        after, _ = run_shape(c, 3, 5, 2, steps=None, resume=states[0])
        assert (taken + after)[:60] == whole


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_exactly(server, workers):
    """torchdata's StatefulDataLoader saves each worker's state (or the
    dataset's) with the batches it yields; restored with as many workers,
    the rest of the epoch comes in order."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    whole = epoch_order(server)
    job = server.submit(SQL, batch_size=7, shuffle=SHUFFLE)
    loader = StatefulDataLoader(sluice.torch.Dataset(job), batch_size=None,
                                num_workers=workers, timeout=120 if workers else 0)
    seen = []
    for i, b in enumerate(loader):
        seen.extend(b["key"])
        if i == 4:
            break
    state = loader.state_dict()
    again = StatefulDataLoader(sluice.torch.Dataset(job), batch_size=None,
                               num_workers=workers, timeout=120 if workers else 0)
    again.load_state_dict(state)
    assert seen + [k for b in again for k in b["key"]] == whole
