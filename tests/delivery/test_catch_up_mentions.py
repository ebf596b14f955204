"""A mention is a steer on every path (issue 15, D54): the live push, the owed sweep, and
the cursor catch-up of a subscribed agent that was offline. Every dispatch says whether the
message mentions its recipient (``mentions_you``)."""

from __future__ import annotations

from delivery_world import World, general_channel

from tidings.delivery.sessions import Dispatch


def setup(world, *agents, subscribed=None):
    return general_channel(world, agents, subscribed=agents if subscribed is None else subscribed, settle=world.pump)


def _flags(session) -> list[tuple[str, str, bool]]:
    out = []
    for item in session.drain():
        assert isinstance(item, Dispatch)
        payload = item.payload()
        out.append((payload["type"], payload["message"]["id"], payload["mentions_you"]))
    return out


def test_a_subscribed_offline_agents_missed_mention_comes_back_as_a_steer_in_cursor_order(world):
    hu, ch, ids = setup(world, "aa", "bb")
    before = world.post(hu, ch, "plain before")
    mention = world.post(hu, ch, "@aa what is on the agenda?")
    after = world.post(hu, ch, "plain after")
    everyone = world.post(hu, ch, "@everyone stand up")
    world.pump()
    assert world.owed(ids["aa"]) == []  # subscribed: the cursor carries it, nothing owed (D18)
    session = world.connect(ids["aa"])
    world.pump()
    assert _flags(session) == [
        ("deliver", before, False),
        ("steer", mention, True),
        ("deliver", after, False),
        ("steer", everyone, True),
    ]
    other = world.connect(ids["bb"])
    world.pump()
    assert [(k, m) for k, m, _ in _flags(other)] == [
        ("deliver", before), ("deliver", mention), ("deliver", after), ("steer", everyone)]


def test_live_dispatches_carry_mentions_you(world):
    hu, ch, ids = setup(world, "aa")
    session = world.connect(ids["aa"])
    world.pump()
    plain = world.post(hu, ch, "hello")
    mention = world.post(hu, ch, "@AA hi")  # the one grammar: case-folded
    email = world.post(hu, ch, "mail bob@aa.example")  # names "aa.example": nobody
    world.pump()
    assert _flags(session) == [("deliver", plain, False), ("steer", mention, True), ("deliver", email, False)]


def test_an_owed_mention_swept_by_the_cursors_is_steered_once(world):
    # Mentioned while outside its sweep set (owed), then subscribed: the cursor sweep steers
    # it, and the owed sweep of the same start does not steer it again.
    # Its cursor survives the unsubscribe, so the re-subscribed sweep reads the mention.
    hu, ch, ids = setup(world, "aa")
    world.unsubscribe(ch, ids["aa"])
    mention = world.post(hu, ch, "@aa owed")
    world.pump()
    assert world.owed(ids["aa"]) == [mention]
    world.subscribe(ch, ids["aa"])
    session = world.connect(ids["aa"])
    world.pump()
    assert [(k, m) for k, m, _ in _flags(session)] == [("steer", mention)]
    world.ack(ids["aa"], mention)
    assert world.owed(ids["aa"]) == []


def test_a_mention_committed_before_the_sweep_read_it_is_steered_once(world):
    hu, ch, ids = setup(world, "aa")
    world.connect(ids["aa"])
    early = world.post(hu, ch, "@aa committed before the sweep read it")  # swept, then not again live
    world.pump()
    late = world.post(hu, ch, "@aa live")
    world.pump()
    assert world.got(ids["aa"]) == [("steer", early), ("steer", late)]


def test_a_live_mention_while_the_session_catches_up_waits_for_the_sweep_in_order(runtime):
    world = World(runtime, sweep_page=2, session_capacity=16, session_low_water=1)
    try:
        hu, ch, ids = setup(world, "aa")
        backlog = [world.post(hu, ch, f"m{i}") for i in range(5)]
        world.pump()
        session = world.connect(ids["aa"])
        world.pump()  # one page of two: the session is still catching up on its cursor
        assert session.pending() == 2
        live = world.post(hu, ch, "@aa while you catch up")
        world.pump()
        got = []
        for _ in range(10):
            got += world.got(ids["aa"], session)
            world.pump()
        assert got == [("deliver", m) for m in backlog] + [("steer", live)]
    finally:
        world.close()
