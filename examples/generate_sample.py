"""Generate examples/clickstream.jsonl: a small clickstream with planted, documented behaviour.

    python -m examples.generate_sample            # rewrites examples/clickstream.jsonl
    python -m examples.generate_sample --seed 3 --out /tmp/other.jsonl

Everything comes from one seeded `random.Random`, so a seed always gives the same file
(tests/examples/test_sample.py checks that the bundled file is this script's output).

The behaviour model: 160 users, one persona each, with one to seven sessions over about three
weeks. A session is a burst of events 5 s to 4 min apart; sessions are one to four days
apart, so each is one episode under `episodeTimeout: 30m`. Every session has background noise
(dashboard and page views, searches, clicks, feature use), and one background event in 25 is
a page that is a signal elsewhere (pricing, seats, support, export, team, members, share),
viewed with no intent behind it. Pricing views and upgrades carry `props: {"plan": ...}`, which
the engine ignores.

- upgrader (22%): over one to three sessions hits plan limits and views pricing (sometimes
  seats); in the last one views pricing again, opens billing and completes the upgrade
  (`upgrade.completed`). One in five gives up instead.
- window shopper (14%): views pricing (sometimes seats) in about half their sessions, but
  never hits a limit and never upgrades.
- churner (14%): in one or two sessions views the cancel page, files a support ticket and
  sometimes starts an export; in the last one views the cancel page and starts an export
  (sometimes files a ticket), then cancels (`subscription.cancelled`) in that session and is
  never seen again. One in five stays. Churners rarely use features.
- waverer (8%): views the cancel page once, keeps using the product, never cancels.
- team lead (14%): looks at the team or its members or hits the seat limit in one session; in
  the last one does all of those and clicks share, then sends an invite (`invite.sent`) in that
  session. One in four does not.
- regular (28%): background noise only, with plenty of feature use.

So in examples/oracular.yaml the upgrade signals (`pricing.viewed`, `limit.hit`,
`billing.opened`, `seats.viewed`), the churn signals (`cancel.viewed`, `export.started`,
`support.ticket`; `feature.used` against) and the invite signals (`team.viewed`,
`share.clicked`, `seat.limit.hit`, `members.viewed`) really precede their outcomes, and
`oracular tune` on the sample suggests a positive weight for each of them (negative for
`feature.used`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 7
USERS = 160
START_MS = 1_767_603_600_000  # 2026-01-05T09:00:00Z, a Monday
DAY_MS = 86_400_000
OUT = Path(__file__).with_name("clickstream.jsonl")

PERSONAS = {  # persona: share of users
    "upgrader": 0.22,
    "window_shopper": 0.14,
    "churner": 0.14,
    "waverer": 0.08,
    "team_lead": 0.14,
    "regular": 0.28,
}
NOISE = ["dashboard.viewed", "page.viewed", "search.performed", "button.clicked"]
# Now and then anyone glances at a page that is a signal elsewhere, with no intent behind it.
INCIDENTAL = [
    "pricing.viewed",
    "seats.viewed",
    "support.ticket",
    "export.started",
    "team.viewed",
    "members.viewed",
    "share.clicked",
]
PLANS = ["team", "business"]


def noise(rng: random.Random, low: int, high: int, feature_use: float = 0.3) -> list[str]:
    """Background events: what every user does whatever they are about to do."""
    names = []
    for _ in range(rng.randint(low, high)):
        draw = rng.random()
        if draw < 0.04:
            names.append(rng.choice(INCIDENTAL))
        elif draw < 0.04 + feature_use:
            names.append("feature.used")
        else:
            names.append(rng.choice(NOISE))
    return names


def upgrader(rng: random.Random) -> list[list[str]]:
    """Pricing views and limit hits over one to three sessions, then billing and the upgrade."""
    sessions = [noise(rng, 2, 5) for _ in range(rng.randint(0, 2))]
    journey = rng.randint(1, 3)
    for n in range(journey):
        session = [*noise(rng, 0, 2), "limit.hit", "pricing.viewed"]
        if rng.random() < 0.5:
            session.append("limit.hit")
        if rng.random() < 0.3:
            session.append("seats.viewed")
        session += noise(rng, 1, 3)
        if n == journey - 1:
            if rng.random() < 0.8:
                session += ["pricing.viewed", "billing.opened"]
                session += [*noise(rng, 0, 2, feature_use=0.0), "upgrade.completed"]
                session += noise(rng, 0, 3)
            else:
                session += noise(rng, 1, 3)
        sessions.append(session)
    sessions += [noise(rng, 2, 5) for _ in range(rng.randint(0, 2))]
    return sessions


def window_shopper(rng: random.Random) -> list[list[str]]:
    """Views pricing now and then; never hits a limit, never upgrades."""
    sessions = []
    for _ in range(rng.randint(2, 4)):
        session = noise(rng, 2, 5)
        if rng.random() < 0.5:
            session.insert(rng.randint(0, len(session)), "pricing.viewed")
            if rng.random() < 0.3:
                session.append("seats.viewed")
        sessions.append(session)
    return sessions


def churner(rng: random.Random) -> list[list[str]]:
    """Cancel-page views, support tickets and exports, then a cancellation in the last session."""
    sessions = [noise(rng, 2, 4, feature_use=0.05) for _ in range(rng.randint(0, 2))]
    for _ in range(rng.randint(1, 2)):
        looking = ["cancel.viewed", "support.ticket"] + ["export.started"] * rng.randint(0, 1)
        rng.shuffle(looking)
        sessions.append(noise(rng, 0, 2, feature_use=0.05) + looking + noise(rng, 1, 2, 0.05))
    final = ["cancel.viewed", "export.started", "support.ticket"][: rng.randint(2, 3)]
    rng.shuffle(final)
    final = noise(rng, 0, 1, feature_use=0.05) + final + noise(rng, 1, 2, feature_use=0.05)
    if rng.random() < 0.8:
        final += ["cancel.viewed", "subscription.cancelled"]  # and never comes back
    else:
        final += noise(rng, 1, 3, feature_use=0.05)
    sessions.append(final)
    return sessions


def waverer(rng: random.Random) -> list[list[str]]:
    """Looks at the cancel page once, then goes back to work and stays."""
    sessions = [noise(rng, 2, 5, feature_use=0.5) for _ in range(rng.randint(3, 5))]
    at = rng.randrange(len(sessions))
    sessions[at].insert(rng.randint(0, len(sessions[at])), "cancel.viewed")
    return sessions


def team_lead(rng: random.Random) -> list[list[str]]:
    """Team and members pages, the seat limit, shares: then, mostly, an invite."""
    sessions = [noise(rng, 2, 4) for _ in range(rng.randint(0, 2))]
    looking = ["team.viewed", "members.viewed", "seat.limit.hit"]
    sessions.append(noise(rng, 0, 2) + rng.sample(looking, rng.randint(1, 3)) + noise(rng, 1, 2))
    final = ["team.viewed", "seat.limit.hit", "share.clicked", "members.viewed"]
    rng.shuffle(final)
    final += rng.sample(["seat.limit.hit", "share.clicked", "team.viewed"], rng.randint(1, 2))
    final = noise(rng, 0, 2) + final + noise(rng, 0, 1, feature_use=0.0)
    if rng.random() < 0.75:
        final += ["invite.sent", *noise(rng, 0, 2)]
    else:
        final += noise(rng, 1, 3)
    sessions.append(final)
    sessions += [noise(rng, 2, 4) for _ in range(rng.randint(0, 1))]
    return sessions


def regular(rng: random.Random) -> list[list[str]]:
    """Uses the product; none of the planted paths."""
    return [noise(rng, 2, 6, feature_use=0.5) for _ in range(rng.randint(2, 5))]


BEHAVIOUR = {
    "upgrader": upgrader,
    "window_shopper": window_shopper,
    "churner": churner,
    "waverer": waverer,
    "team_lead": team_lead,
    "regular": regular,
}


def session_starts(rng: random.Random, count: int) -> list[int]:
    """`count` session start times: the first in the first ten days, then one to four days
    apart, each between 09:00 and 19:00 UTC."""
    day = rng.randrange(10)
    starts = []
    for _ in range(count):
        starts.append(START_MS + day * DAY_MS + rng.randrange(10 * 3_600_000))
        day += rng.randint(1, 4)
    return starts


def generate(seed: int = SEED, users: int = USERS) -> list[dict[str, object]]:
    """The sample's events (native JSON messages), sorted by time; ids e1, e2, ... in order."""
    rng = random.Random(seed)
    personas = rng.choices(list(PERSONAS), weights=list(PERSONAS.values()), k=users)
    rows: list[tuple[int, str, str, dict[str, str] | None]] = []
    for number, persona in enumerate(personas, start=1):
        user = f"user-{number:05d}"
        plan = rng.choice(PLANS)
        sessions = [s for s in BEHAVIOUR[persona](rng) if s]
        for start, names in zip(session_starts(rng, len(sessions)), sessions, strict=True):
            at = start
            for name in names:
                props = {"plan": plan} if name in ("pricing.viewed", "upgrade.completed") else None
                rows.append((at, user, name, props))
                at += rng.randint(5, 240) * 1000  # seconds to minutes: one episode
    rows.sort(key=lambda row: (row[0], row[1]))
    events: list[dict[str, object]] = []
    for n, (at, user, name, props) in enumerate(rows, start=1):
        event: dict[str, object] = {"id": f"e{n}", "user": user, "ts": at, "name": name}
        if props:
            event["props"] = props
        events.append(event)
    return events


def render(events: list[dict[str, object]]) -> str:
    """JSON lines, one event each, as the bundled file holds them."""
    return "".join(json.dumps(event) + "\n" for event in events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed ({SEED})")
    parser.add_argument("--users", type=int, default=USERS, help=f"how many users ({USERS})")
    parser.add_argument("--out", type=Path, default=OUT, help="output file (the bundled sample)")
    args = parser.parse_args(argv)
    events = generate(args.seed, args.users)
    args.out.write_text(render(events), encoding="utf-8")
    print(f"{args.out}: {len(events):,} events of {args.users} users (seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
