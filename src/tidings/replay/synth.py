"""Deterministic synthetic corpus of bridge frames: ``tidings corpus synth``.

The corpus stands in for a capture of the three bridges (docs/api.md §1, §6, §8.3).
Each line is one frame ``{"codec", "codec_version": 1, "dedupe_key", "received_at_ms",
"payload"}`` whose payload copies what the real tools emit, as read by the decoders in
``tidings.ingest.decoders`` (signal-cli JSON-RPC ``receive`` notifications, whatsmeow
events with ``waE2E.Message`` protojson, libgm ``Conversation``/``Message`` protojson).

Determinism
-----------
The same ``frames`` and ``seed`` give a byte-identical file: every random choice comes
from one ``random.Random(seed)``, time is simulated (no wall clock), no set is iterated
and no ``str`` is hashed, and JSON is written with fixed separators and key order.

The model
---------
* **People.** A pool of contacts (size grows with ``frames``), each with a phone number
  in a fictional range, a Signal ACI (a quarter hide their number), a WhatsApp JID (some
  show up in groups under an ``@lid`` JID), a Google participant id and per-network
  display names. A Zipf popularity makes a few people members of many conversations.
  "Self" (the bridge account, +14155550100) is the same person on every network.
* **Conversations.** Per network, direct chats with distinct contacts and groups of
  realistic sizes (mostly 3-10, a few of 20-60; Google groups at most 20). Activity is
  Zipf-distributed over conversations and comes in bursts (the next message often goes
  to the chat that was just active).
* **Time.** A discrete-event simulation starting 2024-06-01 08:00 UTC. Activities arrive
  as a Poisson process, slower at night. Each activity plans every frame it causes (the
  message; its receipts, reactions, edits and deletes; Google status and reaction
  snapshots; conversation snapshots) at its own future receipt time on a heap, and
  frames are written in heap order, so ``received_at_ms`` mostly increases.
* **Networks.**
  - Signal (46%): incoming data messages (replies, attachments, typed ``@handle``
    mentions and real mention placeholders), sync sent messages from our other device,
    edits and remote deletes (both directions), reactions (add, switch, remove; ours
    via sync), delivery/read receipts for our messages, our own read syncs, and a few
    frames that decode to nothing (expiration timers, stickers, group updates).
    Dedupe key ``env:<envelope source>:<envelope timestamp>``.
  - WhatsApp (24%): text/extended text/media messages (some in ephemeral or
    device-sent wrappers), reactions (add, switch, remove), edits, revokes, receipts
    (delivered, read, played, ``sender`` and ``read-self``; a few ``retry``) and
    history syncs. Dedupe key ``wa:<message id>`` for messages, ``hist:<n>`` for history
    chunks and empty for receipts (they carry no stable id).
  - Google Messages (30%): every message is a full ``Message`` snapshot, re-sent on each
    status change (``OUTGOING_SENDING`` ... ``OUTGOING_DISPLAYED``) and each reaction
    change (reaction sets change over time, down to empty). Conversation snapshots are
    re-sent after messages with only the latest-message fields changed, and the whole
    list is sometimes re-sent byte for byte (same key); groups occasionally change roster
    or title. Dedupe keys ``msg:<id>:<hash8>`` / ``conv:<id>:<hash8>``, hash8 being the
    first 4 bytes of the SHA-256 of the payload object, as the reference bridge does
    for the protobuf.
* **Imperfections.** About 2% of frames are re-sent (same key, same payload) right away,
  a few frames later or minutes later; about 0.8% get a ``received_at_ms`` slightly
  earlier than the frame before; some messages arrive after their own edit or reaction;
  some older Google snapshots arrive after newer ones (with their older receipt time);
  and about 0.5% of frames are malformed (a truncated JSON string payload, a wrong type,
  a missing required field, an unknown codec or version, a JSON string payload holding
  an array), each of which the decoders reject with a ``DecodeError``. Every frame,
  malformed or not, keeps the docs/api.md §6 frame shape (payload an object or a string),
  so a bridge could append it and the worker quarantines it.

``synthesize(frames, seed)`` returns the lines and a :class:`SynthStats`;
``run_synth`` is the command (a progress bar for large corpora, a one-line summary).
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import json
import os
import random
import time
from bisect import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

__all__ = ["CODEC_SHARE", "SynthStats", "Corpus", "synthesize", "run_synth"]

GOOGLE = "google.json"
SIGNAL = "signal.jsonrpc"
WHATSAPP = "whatsapp.event"
CODECS = (GOOGLE, SIGNAL, WHATSAPP)
CODEC_SHARE = {GOOGLE: 0.30, SIGNAL: 0.46, WHATSAPP: 0.24}

START_MS = 1_717_228_800_000  # 2024-06-01T08:00:00Z
MALFORMED_RATE = 0.005
DUPLICATE_RATE = 0.02
JITTER_RATE = 0.008
LATE_MESSAGE_RATE = 0.12
STALE_SNAPSHOT_RATE = 0.12
MEAN_GAP_MS = 40_000

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

# --------------------------------------------------------------------------- vocabulary

_FIRST = (
    "June", "Ravi", "Alice", "Bob", "Carol", "Dave", "Zoë", "Søren", "José", "Mei",
    "Aiyana", "Chidi", "Fatima", "Łukasz", "Ngozi", "Renée", "Jürgen", "Priya", "Omar",
    "Hana", "Mateo", "Yuki", "Amara", "Leila", "Tomás", "Inês", "Kofi", "Anya", "Björn",
    "Camille", "Dmitri", "Eun-ji", "Farah", "Gustavo", "Hiroshi", "Ifeoma", "Jonas",
    "Kavya", "Lars", "Maya", "Nikos", "Olga", "Pedro", "Quinn", "Rosa", "Sanjay", "Tariq",
    "Uma", "Valentina", "Wei", "Ximena", "Yusuf", "Zara", "Emma", "Liam", "Noah",
    "Olivia", "Sofia", "Lucas", "Mia", "Ethan", "Aisha", "Ben", "Chloe", "Diego", "Elif",
    "Finn", "Greta", "Hugo", "Ivy", "Jack", "Kai", "Lena", "Max", "Nina", "Oscar",
    "Paula", "Rami", "Sara", "Theo", "Vera", "Will", "Ada", "Malik", "Nour", "Sam",
)
_LAST = (
    "Park", "Shah", "Moreau", "Okafor", "Nguyen", "García", "Müller", "Kowalski", "Rossi",
    "Tanaka", "Kim", "Silva", "Johansson", "O'Brien", "Haddad", "Mensah", "Novak",
    "Ivanova", "Costa", "Dubois", "Fischer", "Hernández", "Jensen", "Khan", "Larsen",
    "Mwangi", "Nakamura", "Olsen", "Petrov", "Quispe", "Reyes", "Schmidt", "Takahashi",
    "Usman", "Volkov", "Walsh", "Xu", "Yılmaz", "Zhang", "Adeyemi", "Becker", "Chen",
    "Díaz", "Eriksen", "Ferreira", "Gupta", "Horvat", "Ito", "Jovanović", "Kaur",
)
_NICKNAMES = ("Mom", "Dad", "Grandma 💕", "Landlord", "Plumber (Joe)", "Dr. Lee office",
              "Coach", "Babysitter", "Neighbour upstairs", "Work - IT desk")
_GROUP_TITLES = (
    "Family", "Climbing crew", "Book club 📚", "Flat 3B", "Soccer Sundays ⚽",
    "Team offsite", "Wedding planning 💍", "Dinner club", "Project Falcon", "Neighbours",
    "Cousins", "Board games 🎲", "Running club", "Parents of 2B", "Ski trip 2024 🎿",
    "On-call", "Ops", "Road trip 🚐", "Hiking", "Familia García", "Über-Team",
    "家族", "Band practice 🎸", "Garden allotment", "Uni friends", "Birthday surprise 🤫",
    "Moving day", "Kitchen reno", "Chess club ♟️", "Lisbon 🇵🇹", "Choir", "5-a-side",
)
_HANDLES = ("scout", "ledger", "triage", "ops-bot", "cal", "june.park", "ravi",
            "everyone", "agents", "helper", "summarizer", "alice_m")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
         "tomorrow", "tonight", "the weekend", "next week")
_PLACES = ("the station", "the usual place", "Luigi's", "the gym", "the office", "home",
           "the park", "the market", "Café Nero", "the north entrance", "gate B12",
           "the library", "Kim's place", "the pub", "the climbing wall")
_ITEMS = ("milk", "the charger", "snacks", "ice", "the keys", "a cake", "bread",
          "the tickets", "some wine", "the salad", "paper plates", "batteries")
_THINGS = ("the invoice", "the doc", "the photos", "the game", "the schedule",
           "the report", "the new route", "the recipe", "the booking", "the slides",
           "the quote", "the plan", "the playlist", "the video", "the forecast")
_SHORT = (
    "ok", "ok 👍", "yes", "no worries", "haha", "lol", "omw", "thanks!", "thank you 🙏",
    "sure", "sounds good", "👍", "❤️", "😂😂", "nice", "perfect", "see you soon",
    "on my way", "5 min", "can't today, sorry", "yep", "nope", "👀", "🎉🎉🎉",
    "good morning ☀️", "night 🌙", "brb", "call you later", "got it", "done ✅", "np",
    "same", "wow", "true", "agreed", "ha, classic", "lmk", "k", "Yes!", "hmm",
    "where are you?", "almost there", "love it", "so good", "🙌", "🤣", "oops",
)
_TEMPLATES = (
    "are we still on for {day}?", "running {n} min late, sorry", "can you grab {item} on the way?",
    "I'm at {place}, where are you?", "meeting moved to {time}", "did you see {thing}?",
    "just landed ✈️", "who's bringing {item}?", "I'll bring {item}", "let's do {time} at {place}",
    "happy birthday {first}!! 🎂", "{first} said {time} works", "is {place} open on {day}?",
    "{thing} is fixed now", "reminder: {thing} is due {day}", "can someone send me {thing}?",
    "I left {item} at {place} 🤦", "traffic is awful, ETA {time}", "booked a table for {n} at {time}",
    "pics from {day} 📸", "what time is {thing} {day}?", "how was {thing}?",
    "thanks for {thing}, it was great", "shall we move it to {day}?", "{first} can you check {thing}?",
    "I'm outside {place}", "do we need {item}?", "who has {item}?", "see you at {time} 👋",
    "just sent you {thing}", "call me when you can", "can't find {thing} anywhere",
    "{thing} looks good to me", "quick q: is {day} ok for everyone?", "ETA {n} min",
    "we're at {place} if you want to join", "leaving now", "the {n}:30 train is cancelled 🙄",
    "I owe you {n}€ for {item}", "grabbing {item}, anyone want anything?",
)
_MENTION_TEMPLATES = (
    "@{h} can you take a look at {thing}?", "@{h} summarise this thread please",
    "thanks @{h}!", "@{h} what's the status on {thing}?", "cc @{h}",
    "@{h} @{h2} does {time} work for you?", "@{h} remind me about {thing} {day}",
    "hey @{h}, {thing} is ready", "@{h} 👆",
)
_FOREIGN = (
    "¿Nos vemos a las {time}?", "Bis später!", "À demain 😊", "ありがとう！", "今天晚上吃什么？",
    "شكرا جزيلا", "Grüße aus München", "Ça marche", "Danke dir!", "Tudo bem?",
    "Привет, как дела?", "नमस्ते 🙏", "다음 주에 봐요", "Jó reggelt!", "Hyvää huomenta",
    "Καλημέρα!", "Dzięki, do jutra", "¡Qué bueno! 😄", "Ik ben er over {n} minuten",
    "Vi ses på {place}", "שבת שלום", "Ευχαριστώ πολύ", "Çok güzel 👌",
)
_LONG_SENTENCES = (
    "So I talked to {first} about {thing} and we think {day} works best.",
    "The plan is to meet at {place} around {time}, then head over together.",
    "If anyone can't make it, let me know by {day} so I can change the booking.",
    "Also, don't forget {item}, last time we had none and it was a disaster 😅.",
    "I put everything in {thing}, have a look when you get a chance.",
    "Parking is a nightmare there, so maybe take the train?",
    "Here's the link: https://maps.app.goo.gl/{code}",
    "Weather says rain after {time} so bring a jacket ☔.",
    "Honestly I think we should just keep it simple this time.",
    "Let me know what you think, no rush.",
)
_EMOJI = ("😂", "👍", "❤️", "🙏", "🔥", "🎉", "😅", "😊", "🥳", "😭", "🤔", "👀", "💪", "✨", "🙌", "😬")
_REACTIONS = ("👍", "❤️", "😂", "😮", "😢", "🙏", "🔥", "🎉", "👎", "😡")
_REACTION_CUM = tuple(accumulate((30, 25, 20, 5, 5, 8, 5, 4, 2, 1)))
_GOOGLE_REACTION_TYPE = {"👍": "LIKE", "❤️": "LOVE", "😂": "LAUGH", "😮": "SURPRISED",
                         "😢": "SAD", "😡": "ANGRY", "👎": "DISLIKE"}
_COLORS = ("#4285f4", "#ff8a65", "#7cb342", "#ab47bc", "#26a69a", "#ec407a", "#5c6bc0",
           "#ffa726", "#8d6e63", "#78909c")
_GROUP_SIZES = (2, 3, 4, 5, 6, 8, 10, 14, 20, 35, 60)
_GROUP_SIZE_CUM = tuple(accumulate((20, 18, 15, 12, 10, 8, 6, 4, 3, 2, 1)))
_MEDIA = (
    # (kind, mime, extension)
    ("image", "image/jpeg", "jpg"), ("image", "image/jpeg", "jpg"), ("image", "image/png", "png"),
    ("video", "video/mp4", "mp4"), ("audio", "audio/ogg; codecs=opus", "ogg"),
    ("document", "application/pdf", "pdf"),
)
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


# --------------------------------------------------------------------------- model


@dataclass(eq=False, slots=True)
class _Person:
    idx: int
    first: str
    last: str
    phone: str
    aci: str
    number_hidden: bool
    on_signal: bool
    on_whatsapp: bool
    lid: str
    uses_lid: bool
    wa_device: int
    wa_id_style: int
    contact_name: str
    push_name: str
    color: str
    contact_id: str
    gpid: str = ""

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclass(eq=False, slots=True)
class _Msg:
    mid: str          # WhatsApp / Google message id; Signal: the sent timestamp
    ts: int
    author: _Person | None  # None: ourselves
    body: str


@dataclass(eq=False, slots=True)
class _Conv:
    platform: str
    cid: str
    group: bool
    members: list[_Person]
    title: str
    recent: list[_Msg] = field(default_factory=list)
    revision: int = 0
    ephemeral: bool = False
    rcs: bool = True
    g_last: tuple[str, str] | None = None   # (dedupe key, payload) of the last snapshot
    g_latest: tuple[str, str, str, int, str] | None = None
    unread: bool = False
    snapshot_sent: bool = False


@dataclass
class SynthStats:
    """What went into a corpus; ``run_synth`` prints a summary of it."""

    frames: int = 0
    per_codec: dict[str, int] = field(default_factory=dict)
    malformed: int = 0
    malformed_by_type: dict[str, int] = field(default_factory=dict)
    malformed_indices: list[int] = field(default_factory=list)
    duplicates: int = 0              # frames whose (codec, non-empty key) came before
    resent: int = 0                  # re-sent by the bridge: same payload (same key or both empty)
    google_conversation_resends: int = 0  # conversation snapshots re-sent byte for byte
    google_snapshot_revisits: int = 0     # message snapshots back to an earlier state (same key)
    empty_keys: int = 0
    out_of_order: int = 0            # received_at_ms below an earlier frame's
    late_messages: int = 0           # message frames written after their edit/reaction
    stale_snapshots: int = 0         # older Google snapshots written after newer ones
    google_conversation_frames: int = 0
    google_unchanged_snapshots: int = 0   # same kind, title and roster as the last one
    google_changed_snapshots: int = 0     # roster or title changed
    people: int = 0
    conversations: dict[str, dict[str, int]] = field(default_factory=dict)
    first_received_at_ms: int = 0
    last_received_at_ms: int = 0


@dataclass
class Corpus:
    lines: list[str]
    stats: SynthStats


# --------------------------------------------------------------------------- simulation


class _Sim:
    def __init__(self, frames: int, seed: int) -> None:
        self.n = frames
        self.rng = random.Random(seed)
        self.heap: list[tuple] = []
        self.seq = 0
        self.sched = {c: 0 for c in CODECS}
        self.out: list[list] = []  # [codec, version, key, received_at_ms, payload_json]
        self.stats = SynthStats()
        self.seen_keys: set[tuple[str, str]] = set()
        self.last_recv = 0
        self.g_sig: dict[str, tuple] = {}
        self.sig_keys: set[str] = set()
        self.g_mid = 1000 + self.rng.randrange(9000)
        self.g_cid = 1 + self.rng.randrange(40)
        self.g_pid = 1
        self.hist_chunk = 0
        self.hot: dict[str, _Conv | None] = {c: None for c in CODECS}
        self._people()
        self._conversations()

    # ------------------------------------------------------------------ random helpers

    def hexid(self, bits: int) -> str:
        return format(self.rng.getrandbits(bits), f"0{bits // 4}X")

    def b64(self, nbytes: int) -> str:
        return base64.b64encode(self.rng.randbytes(nbytes)).decode("ascii")

    def uuid(self) -> str:
        v = self.rng.getrandbits(128)
        h = format(v, "032x")
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[v & 3]}{h[17:20]}-{h[20:32]}"

    def expo(self, mean_ms: float) -> int:
        return int(self.rng.expovariate(1.0 / mean_ms))

    def reaction_emoji(self, avoid: str = "") -> str:
        while True:
            e = _REACTIONS[bisect(_REACTION_CUM, self.rng.random() * _REACTION_CUM[-1])]
            if e != avoid:
                return e

    # ------------------------------------------------------------------ people

    def _people(self) -> None:
        rng = self.rng
        count = max(30, min(500, self.n // 60))
        phones: set[str] = {"+14155550100"}
        areas = ("415", "510", "628", "212", "646", "312", "206", "617", "303", "512")
        self.people: list[_Person] = []
        for i in range(count):
            while True:
                r = rng.random()
                if r < 0.40:
                    phone = f"+1{rng.choice(areas)}5550{rng.randrange(100, 200)}"
                elif r < 0.65:
                    phone = f"+447700900{rng.randrange(1000):03d}"
                elif r < 0.75:
                    phone = f"+61491570{rng.randrange(1000):03d}"
                elif r < 0.85:
                    phone = f"+493023125{rng.randrange(1000):03d}"
                else:
                    phone = f"+3363998{rng.randrange(10000):04d}"
                if phone not in phones:
                    phones.add(phone)
                    break
            first, last = rng.choice(_FIRST), rng.choice(_LAST)
            r = rng.random()
            contact = rng.choice(_NICKNAMES) if r < 0.04 else (first if r < 0.15 else f"{first} {last}")
            r = rng.random()
            push = (f"{first} {rng.choice(_EMOJI)}" if r < 0.15 else
                    first.lower() if r < 0.25 else
                    f"{first} {last[0]}." if r < 0.45 else first)
            self.people.append(_Person(
                idx=i, first=first, last=last, phone=phone, aci=self.uuid(),
                number_hidden=rng.random() < 0.25, on_signal=rng.random() < 0.6,
                on_whatsapp=rng.random() < 0.7,
                lid=str(rng.randrange(10**14, 10**15)), uses_lid=rng.random() < 0.15,
                wa_device=rng.choice((0, 0, 0, 1, 2, 12, 27)), wa_id_style=rng.randrange(3),
                contact_name=contact, push_name=push, color=rng.choice(_COLORS),
                contact_id=str(rng.randrange(1, 2000)) if rng.random() < 0.8 else "",
            ))
        self.me = _Person(
            idx=-1, first="Sam", last="Reyes", phone="+14155550100", aci=self.uuid(),
            number_hidden=False, on_signal=True, on_whatsapp=True, lid="",
            uses_lid=False, wa_device=0, wa_id_style=0, contact_name="", push_name="Sam",
            color="#4285f4", contact_id="", gpid="1",
        )
        order = list(range(count))
        rng.shuffle(order)
        weights = [0.0] * count
        for rank, idx in enumerate(order):
            weights[idx] = 1.0 / (rank + 1) ** 0.9
        self.pop_cum = list(accumulate(weights))
        self.stats.people = count

    def pick_people(self, k: int, ok: Callable[[_Person], bool], exclude: set[int]) -> list[_Person]:
        chosen: list[_Person] = []
        taken = set(exclude)
        total = self.pop_cum[-1]
        tries = 0
        while len(chosen) < k and tries < 50 * k + 200:
            tries += 1
            p = self.people[bisect(self.pop_cum, self.rng.random() * total)]
            if p.idx in taken or not ok(p):
                continue
            taken.add(p.idx)
            chosen.append(p)
        return chosen

    # ------------------------------------------------------------------ conversations

    def _conversations(self) -> None:
        rng = self.rng
        n = self.n
        plan = {
            SIGNAL: (max(4, min(160, n // 220)), 0.35, lambda p: p.on_signal, 60),
            WHATSAPP: (max(3, min(100, n // 330)), 0.40, lambda p: p.on_whatsapp, 60),
            GOOGLE: (max(3, min(120, n // 300)), 0.25, lambda p: True, 20),
        }
        self.convs: dict[str, list[_Conv]] = {}
        self.conv_cum: dict[str, list[float]] = {}
        for platform in (SIGNAL, WHATSAPP, GOOGLE):
            count, group_share, ok, max_size = plan[platform]
            n_groups = max(1, round(count * group_share))
            directs = self.pick_people(count - n_groups, ok, set())
            convs: list[_Conv] = []
            for person in directs:
                convs.append(self._new_conv(platform, False, [person]))
            for _ in range(n_groups):
                size = _GROUP_SIZES[bisect(_GROUP_SIZE_CUM, rng.random() * _GROUP_SIZE_CUM[-1])]
                members = self.pick_people(min(size, max_size), ok, set())
                if len(members) < 2:
                    continue
                convs.append(self._new_conv(platform, True, members))
            rng.shuffle(convs)
            self.convs[platform] = convs
            self.conv_cum[platform] = list(accumulate(1.0 / (i + 1) ** 1.05 for i in range(len(convs))))
            self.stats.conversations[platform] = {
                "direct": sum(1 for c in convs if not c.group),
                "group": sum(1 for c in convs if c.group),
            }

    def _new_conv(self, platform: str, group: bool, members: list[_Person]) -> _Conv:
        rng = self.rng
        if platform == SIGNAL:
            cid = self.b64(32) if group else members[0].aci
            title = rng.choice(_GROUP_TITLES) if group else ""
            conv = _Conv(platform, cid, group, members, title, revision=rng.randrange(1, 40))
        elif platform == WHATSAPP:
            if group:
                cid = f"120363{rng.randrange(10**11, 10**12)}@g.us"
            else:
                cid = members[0].phone[1:] + "@s.whatsapp.net"
            conv = _Conv(platform, cid, group, members, rng.choice(_GROUP_TITLES) if group else "",
                         ephemeral=rng.random() < 0.12)
        else:
            cid = str(self.g_cid)
            self.g_cid += 1 + (rng.random() < 0.3) * rng.randrange(1, 9)
            for p in members:
                if not p.gpid:
                    self.g_pid += 1
                    p.gpid = str(self.g_pid)
            title = ""
            if group and rng.random() < 0.7:
                title = rng.choice(_GROUP_TITLES)
            conv = _Conv(platform, cid, group, members, title, rcs=rng.random() < 0.7)
        return conv

    def pick_conv(self, platform: str) -> _Conv:
        hot = self.hot[platform]
        if hot is not None and self.rng.random() < 0.5:
            return hot
        cum = self.conv_cum[platform]
        conv = self.convs[platform][bisect(cum, self.rng.random() * cum[-1])]
        self.hot[platform] = conv
        return conv

    # ------------------------------------------------------------------ heap

    def push(self, t: int, codec: str, key: str, payload: str, meta: tuple | None = None,
             recv: int | None = None) -> None:
        heapq.heappush(self.heap, (t, self.seq, codec, key, payload, recv, meta))
        self.seq += 1
        self.sched[codec] += 1

    def emit_next(self) -> None:
        t, _, codec, key, payload, recv, meta = heapq.heappop(self.heap)
        rng = self.rng
        st = self.stats
        r = t if recv is None else recv
        if recv is None and self.out and rng.random() < JITTER_RATE:
            r = self.last_recv - rng.randint(1, 1200)
        self.last_recv = r
        self.out.append([codec, 1, key, r, payload])
        tag = meta[0] if meta else None
        if tag == "dup":
            st.resent += 1
        if key:
            if (codec, key) in self.seen_keys:
                st.duplicates += 1
                if tag == "gconv":
                    st.google_conversation_resends += 1
                elif tag != "dup":
                    st.google_snapshot_revisits += 1
            else:
                self.seen_keys.add((codec, key))
        else:
            st.empty_keys += 1
        if tag == "gconv":
            st.google_conversation_frames += 1
            cid, sig = meta[1], meta[2]
            prev = self.g_sig.get(cid)
            if prev is not None:
                if prev == sig:
                    st.google_unchanged_snapshots += 1
                else:
                    st.google_changed_snapshots += 1
            self.g_sig[cid] = sig
        elif tag == "late":
            st.late_messages += 1
        elif tag == "stale":
            st.stale_snapshots += 1
        if tag != "dup" and rng.random() < DUPLICATE_RATE:
            x = rng.random()
            delay = (rng.randint(1, 300) if x < 0.5 else
                     rng.randint(1_000, 60_000) if x < 0.85 else
                     rng.randint(60_000, 1_800_000))
            self.push(max(t, r) + delay, codec, key, payload, ("dup",))

    # ------------------------------------------------------------------ run

    def run(self, good: int, progress: Callable[[int], None] | None) -> None:
        rng = self.rng
        self._opening(START_MS)
        t = START_MS + 60_000
        next_tick = 1000
        while len(self.out) < good:
            if not self.heap or t <= self.heap[0][0]:
                self.activity(t)
                hour = ((t - START_MS) // 3_600_000 + 8) % 24
                slow = 4.0 if hour < 7 else (1.8 if hour >= 22 else 1.0)
                t += 200 + int(rng.expovariate(1.0 / (MEAN_GAP_MS * slow)))
                continue
            self.emit_next()
            if progress is not None and len(self.out) >= next_tick:
                progress(len(self.out))
                next_tick += 1000

    def _opening(self, t: int) -> None:
        """The bridges connect: Google sends its conversation list, WhatsApp a history chunk."""
        for i, conv in enumerate(self.convs[GOOGLE][:25]):
            self.google_conversation(conv, t + 40 * i)
        self.whatsapp_history(t + 5_000)

    def activity(self, t: int) -> None:
        rng = self.rng
        total = sum(self.sched.values()) + 1
        if rng.random() < 0.4:
            platform = max(CODECS, key=lambda c: CODEC_SHARE[c] * total - self.sched[c])
        else:
            x = rng.random()
            platform = GOOGLE if x < 0.30 else (SIGNAL if x < 0.76 else WHATSAPP)
        x = rng.random()
        if platform == GOOGLE:
            if x < 0.03:
                self.google_refresh(t)
            elif x < 0.045:
                self.google_roster_change(t)
            elif x < 0.052:
                self.google_title_change(t)
            else:
                self.message(self.pick_conv(GOOGLE), t)
        elif platform == SIGNAL:
            if x < 0.012:
                self.signal_noise(self.pick_conv(SIGNAL), t)
            else:
                self.message(self.pick_conv(SIGNAL), t)
        else:
            if x < 0.004:
                self.whatsapp_history(t)
            else:
                self.message(self.pick_conv(WHATSAPP), t)

    # ------------------------------------------------------------------ bodies

    def body(self, conv: _Conv) -> str:
        rng = self.rng
        x = rng.random()
        if x < 0.28:
            text = rng.choice(_SHORT)
        elif x < 0.82:
            text = self.fill(rng.choice(_TEMPLATES), conv)
        elif x < 0.88:
            text = self.fill(rng.choice(_FOREIGN), conv)
        else:
            text = " ".join(self.fill(rng.choice(_LONG_SENTENCES), conv)
                            for _ in range(rng.randint(2, 6)))
        if rng.random() < (0.09 if conv.group else 0.03):
            text = self.fill(rng.choice(_MENTION_TEMPLATES), conv) + ("" if x < 0.28 else " " + text)
        if rng.random() < 0.12:
            text += " " + rng.choice(_EMOJI)
        if rng.random() < 0.05:
            text = text[0].upper() + text[1:] if text[0].islower() else text.lower()
        return text

    def fill(self, template: str, conv: _Conv) -> str:
        rng = self.rng
        if "{" not in template:
            return template
        h = self.handle(conv)
        return template.format(
            day=rng.choice(_DAYS), n=rng.randint(2, 45), item=rng.choice(_ITEMS),
            place=rng.choice(_PLACES), thing=rng.choice(_THINGS),
            time=f"{rng.randint(6, 22)}:{rng.choice(('00', '15', '30', '45'))}",
            first=rng.choice(conv.members).first, h=h, h2=self.handle(conv),
            code="".join(rng.choice(_B64) for _ in range(10)),
        )

    def handle(self, conv: _Conv) -> str:
        if self.rng.random() < 0.6:
            return self.rng.choice(_HANDLES)
        p = self.rng.choice(conv.members)
        name = p.first.lower()
        return name if name.isascii() and name.isalnum() else p.last.lower().replace("'", "")

    def edited(self, body: str) -> str:
        rng = self.rng
        x = rng.random()
        if x < 0.3:
            return body + "*"
        if x < 0.55:
            return body + " " + rng.choice(_EMOJI)
        if x < 0.75:
            return "sorry, " + body
        if x < 0.9:
            return f"{body} (at {rng.randint(6, 22)}:{rng.choice(('00', '30'))})"
        return rng.choice(_SHORT)

    # ------------------------------------------------------------------ message planning

    def message(self, conv: _Conv, t: int) -> None:
        rng = self.rng
        if conv.group:
            author = None if rng.random() < 0.2 else rng.choice(conv.members)
        else:
            author = None if rng.random() < 0.45 else conv.members[0]
        reply_to = None
        if conv.recent and rng.random() < 0.1:
            reply_to = rng.choice(conv.recent[-8:])
        media = rng.choice(_MEDIA) if rng.random() < 0.06 else None
        body = self.body(conv)
        if media is not None and rng.random() < 0.6:
            body = ""  # most photos go without a caption
        if media is not None and media[0] == "audio":
            body = ""
        if conv.platform == SIGNAL:
            self.signal_message(conv, author, t, body, reply_to, media)
        elif conv.platform == WHATSAPP:
            self.whatsapp_message(conv, author, t, body, reply_to, media)
        else:
            self.google_message(conv, author, t, body, reply_to, media)

    def reaction_plan(self, conv: _Conv, author: _Person | None, t: int, rate: float) -> list[tuple]:
        """[(time, actor or None for us, emoji, action)] sorted by time."""
        rng = self.rng
        if rng.random() >= rate:
            return []
        candidates: list[_Person | None] = [None] if author is not None else []
        candidates += [p for p in conv.members if p is not author]
        k = 1
        if conv.group:
            k += (rng.random() < 0.4) + (rng.random() < 0.2) + (rng.random() < 0.1)
        actors = rng.sample(candidates, min(k, len(candidates)))
        plan: list[tuple] = []
        for actor in actors:
            ta = t + 2_000 + self.expo(6 * 60_000)
            emoji = self.reaction_emoji()
            plan.append((ta, actor, emoji, "add"))
            x = rng.random()
            if x < 0.15:
                plan.append((ta + 3_000 + self.expo(8 * 60_000), actor, self.reaction_emoji(emoji), "switch"))
            elif x < 0.32:
                plan.append((ta + 3_000 + self.expo(12 * 60_000), actor, emoji, "remove"))
        plan.sort(key=lambda item: item[0])
        return plan

    def remember(self, conv: _Conv, msg: _Msg) -> None:
        conv.recent.append(msg)
        if len(conv.recent) > 30:
            del conv.recent[:10]

    # ------------------------------------------------------------------ Signal

    def sig_ts(self, source: str, ts: int) -> int:
        while f"env:{source}:{ts}" in self.sig_keys:
            ts += 1
        self.sig_keys.add(f"env:{source}:{ts}")
        return ts

    @staticmethod
    def sig_legacy(p: _Person) -> str:
        return p.aci if p.number_hidden else p.phone

    def sig_recv(self, ts: int) -> int:
        if self.rng.random() < 0.03:  # the phone was offline: delivered in a catch-up
            return ts + 30_000 + self.expo(10 * 60_000)
        return ts + 150 + self.rng.randrange(900)

    def sig_frame(self, who: _Person | None, ts: int, recv: int, content: dict,
                  meta: tuple | None = None, reserved: bool = False) -> None:
        """Push one envelope from ``who`` (None: our other device) received at ``recv``.

        The envelope timestamp is moved on by a millisecond or two when ``who`` already
        sent an envelope at ``ts`` (the dedupe key would collide), unless the caller
        ``reserved`` it with :meth:`sig_ts` first."""
        rng = self.rng
        p = who if who is not None else self.me
        legacy = p.phone if who is None else self.sig_legacy(p)
        if not reserved:
            ts = self.sig_ts(legacy, ts)
        recv = max(recv, ts + 40)
        sr = min(ts + 80 + rng.randrange(320), recv - 30)
        sd = max(sr + 5, recv - 15 - rng.randrange(45))
        env = {
            "source": legacy,
            "sourceNumber": None if (who is not None and p.number_hidden) else p.phone,
            "sourceUuid": p.aci,
            "sourceName": p.name if who is not None else "Sam Reyes",
            "sourceDevice": (2 if who is None else 1 + (p.idx % 3 == 0)),
            "timestamp": ts,
            "serverReceivedTimestamp": sr,
            "serverDeliveredTimestamp": sd,
        }
        env.update(content)
        payload = {"jsonrpc": "2.0", "method": "receive",
                   "params": {"envelope": env, "account": self.me.phone}}
        self.push(recv, SIGNAL, f"env:{legacy}:{ts}", _dumps(payload), meta)

    def sig_group(self, conv: _Conv, kind: str = "DELIVER") -> dict:
        return {"groupId": conv.cid, "groupName": conv.title, "revision": conv.revision, "type": kind}

    def sig_target(self, author: _Person | None, prefix: str, legacy_key: str) -> dict:
        p = author if author is not None else self.me
        return {
            legacy_key: p.phone if author is None else self.sig_legacy(p),
            f"{prefix}Number": None if (author is not None and p.number_hidden) else p.phone,
            f"{prefix}Uuid": p.aci,
        }

    def sig_data(self, conv: _Conv, ts: int, extra: dict) -> dict:
        data: dict[str, Any] = {"timestamp": ts, "message": None, "expiresInSeconds": 0,
                                "viewOnce": False}
        data.update(extra)
        if conv.group:
            data["groupInfo"] = self.sig_group(conv)
        return data

    def sig_wrap(self, conv: _Conv, who: _Person | None, data: dict) -> dict:
        """``dataMessage`` for others, a sync ``sentMessage`` for us."""
        if who is not None:
            return {"dataMessage": data}
        sent: dict[str, Any] = {}
        if conv.group:
            sent.update({"destination": None, "destinationNumber": None, "destinationUuid": None})
        else:
            sent.update(self.sig_target(conv.members[0], "destination", "destination"))
        sent.update(data)
        return {"syncMessage": {"sentMessage": sent}}

    def signal_message(self, conv: _Conv, author: _Person | None, t: int, body: str,
                       reply_to: _Msg | None, media: tuple | None) -> None:
        rng = self.rng
        legacy = self.me.phone if author is None else self.sig_legacy(author)
        ts = self.sig_ts(legacy, t)
        extra: dict[str, Any] = {"message": body or None}
        if reply_to is not None:
            extra["quote"] = {"id": reply_to.ts, **self.sig_target(reply_to.author, "author", "author"),
                              "text": reply_to.body or None, "attachments": []}
        if conv.group and body and rng.random() < 0.03:
            target = rng.choice(conv.members)
            extra["message"] = "\ufffc " + body
            extra["mentions"] = [{"name": target.name, "number": None if target.number_hidden else target.phone,
                                  "uuid": target.aci, "start": 0, "length": 1}]
        if media is not None:
            kind, mime, ext = media
            extra["attachments"] = [{
                "contentType": mime, "filename": f"signal-{ts}.{ext}" if rng.random() < 0.5 else None,
                "id": "".join(rng.choice(_B64) for _ in range(20)) + "." + ext,
                "size": rng.randrange(20_000, 4_000_000),
                **({"width": 1170, "height": 2532} if kind == "image" else {}),
                "caption": None, "uploadTimestamp": ts - rng.randrange(500, 3000),
            }]
        msg = _Msg(str(ts), ts, author, body)
        recv = self.sig_recv(ts)

        # follow-ups
        firsts: list[int] = []
        reactions = self.reaction_plan(conv, author, ts, 0.10)
        for ta, actor, emoji, action in reactions:
            reaction = {"emoji": emoji, **self.sig_target(author, "targetAuthor", "targetAuthor"),
                        "targetSentTimestamp": ts, "isRemove": action == "remove"}
            self.sig_frame(actor, ta, self.sig_recv(ta),
                           self.sig_wrap(conv, actor, self.sig_data(conv, ta, {"reaction": reaction})))
            firsts.append(ta)
        x = rng.random()
        if body and x < 0.035:
            te = ts + 8_000 + self.expo(3 * 60_000)
            new_body = self.edited(body)
            edit_data = self.sig_data(conv, te, {"message": new_body})
            edit = {"targetSentTimestamp": ts, "dataMessage": edit_data}
            if author is None:
                sent = self.sig_wrap(conv, None, {"timestamp": te})
                sent["syncMessage"]["sentMessage"]["editMessage"] = edit
                self.sig_frame(None, te, self.sig_recv(te), sent)
            else:
                self.sig_frame(author, te, self.sig_recv(te), {"editMessage": edit})
            firsts.append(te)
        elif x < 0.05:
            td = ts + 10_000 + self.expo(15 * 60_000)
            data = self.sig_data(conv, td, {"remoteDelete": {"timestamp": ts}})
            self.sig_frame(author, td, self.sig_recv(td), self.sig_wrap(conv, author, data))
        if author is None:
            recipients = conv.members if not conv.group else rng.sample(conv.members, min(len(conv.members), 6))
            for p in recipients:
                if rng.random() < 0.15:
                    continue  # offline, never acknowledged in this capture
                stamps = [ts]
                prev = [m for m in conv.recent[-6:] if m.author is None]
                td = ts + 300 + self.expo(2_500)
                self.sig_frame(p, td, self.sig_recv(td), {"receiptMessage": {
                    "when": td, "isDelivery": True, "isRead": False, "isViewed": False,
                    "timestamps": stamps}})
                if rng.random() < 0.7:
                    tr = td + 20_000 + self.expo(40 * 60_000)
                    if prev and rng.random() < 0.3:
                        stamps = [prev[-1].ts, ts]
                    self.sig_frame(p, tr, self.sig_recv(tr), {"receiptMessage": {
                        "when": tr, "isDelivery": False, "isRead": True, "isViewed": False,
                        "timestamps": stamps}})
        elif rng.random() < 0.45:
            tr = ts + 15_000 + self.expo(30 * 60_000)
            reads = [m for m in conv.recent[-4:] if m.author is author and rng.random() < 0.5]
            entries = [{"sender": self.sig_legacy(m.author), **self._sig_sender(m.author),
                        "timestamp": m.ts} for m in reads + [msg]]
            self.sig_frame(None, tr, self.sig_recv(tr), {"syncMessage": {"readMessages": entries}})
        self.remember(conv, msg)

        content = self.sig_wrap(conv, author, self.sig_data(conv, ts, extra))
        if firsts and rng.random() < LATE_MESSAGE_RATE:
            late = min(firsts) + 300 + rng.randrange(8_000)
            self.sig_frame(author, ts, late, content, ("late",), reserved=True)
        else:
            self.sig_frame(author, ts, recv, content, reserved=True)

    def _sig_sender(self, p: _Person) -> dict:
        return {"senderNumber": None if p.number_hidden else p.phone, "senderUuid": p.aci}

    def signal_noise(self, conv: _Conv, t: int) -> None:
        """Envelopes that decode to nothing: timers, stickers, group updates."""
        rng = self.rng
        who = rng.choice(conv.members)
        x = rng.random()
        if x < 0.4:
            data = self.sig_data(conv, t, {"expiresInSeconds": rng.choice((0, 3600, 86400, 604800)),
                                           "isExpirationUpdate": True})
        elif x < 0.7:
            data = self.sig_data(conv, t, {"sticker": {
                "packId": self.hexid(128).lower(), "stickerId": rng.randrange(40)}})
        else:
            if conv.group:
                conv.revision += 1
            data = self.sig_data(conv, t, {})
            if conv.group:
                data["groupInfo"]["type"] = "UPDATE"
        self.sig_frame(who, t, self.sig_recv(t), {"dataMessage": data})

    # ------------------------------------------------------------------ WhatsApp

    def wa_id(self, style: int) -> str:
        if style == 0:
            return "3EB0" + self.hexid(64)
        if style == 1:
            return "3A" + self.hexid(72)
        return self.hexid(128)

    def wa_jid(self, p: _Person | None, conv: _Conv, device: bool = True) -> str:
        if p is None:
            return "14155550100@s.whatsapp.net"
        dev = f":{p.wa_device}" if device and p.wa_device else ""
        if conv.group and p.uses_lid:
            return f"{p.lid}{dev}@lid"
        return f"{p.phone[1:]}{dev}@s.whatsapp.net"

    def wa_key(self, conv: _Conv, msg: _Msg) -> dict:
        key: dict[str, Any] = {"remoteJID": conv.cid, "fromMe": msg.author is None, "ID": msg.mid}
        if conv.group and msg.author is not None:
            key["participant"] = self.wa_jid(msg.author, conv, device=False)
        return key

    def wa_recv(self, ts: int) -> int:
        if self.rng.random() < 0.03:
            return ts + 20_000 + self.expo(5 * 60_000)
        return ts + 200 + self.rng.randrange(1_500)

    def wa_frame(self, conv: _Conv, who: _Person | None, mid: str, ts_ms: int, message: dict,
                 recv: int, meta: tuple | None = None) -> None:
        payload = {
            "kind": "message", "chat_jid": conv.cid, "sender_jid": self.wa_jid(who, conv),
            "message_id": mid, "timestamp_ms": ts_ms, "is_from_me": who is None,
            "is_group": conv.group, "push_name": (who.push_name if who is not None else self.me.push_name),
            "message": message,
        }
        self.push(recv, WHATSAPP, f"wa:{mid}", _dumps(payload), meta)

    def wa_receipt(self, conv: _Conv, who: _Person | None, rtype: str, ids: list[str], t: int) -> None:
        payload = {
            "kind": "receipt", "chat_jid": conv.cid,
            "sender_jid": ("14155550100:3@s.whatsapp.net" if who is None else self.wa_jid(who, conv)),
            "timestamp_ms": t // 1000 * 1000, "is_from_me": who is None, "is_group": conv.group,
            "receipt_type": rtype, "message_ids": ids,
        }
        self.push(t + 100 + self.rng.randrange(600), WHATSAPP, "", _dumps(payload))

    def wa_content(self, conv: _Conv, author: _Person | None, body: str, reply_to: _Msg | None,
                   media: tuple | None, ts: int) -> dict:
        rng = self.rng
        context: dict[str, Any] = {}
        if reply_to is not None:
            context["stanzaID"] = reply_to.mid
            context["participant"] = self.wa_jid(reply_to.author, conv, device=False)
            context["quotedMessage"] = {"conversation": reply_to.body or "📷 Photo"}
        if conv.group and body and rng.random() < 0.05:
            target = rng.choice(conv.members)
            body = f"@{target.phone[1:]} {body}"
            context["mentionedJID"] = [f"{target.phone[1:]}@s.whatsapp.net"]
        if conv.ephemeral:
            context["expiration"] = 604800
        if media is not None:
            kind, mime, ext = media
            sub: dict[str, Any] = {
                "URL": f"https://mmg.whatsapp.net/v/t62.7118-24/{rng.randrange(10**8)}_{self.hexid(32).lower()}.enc",
                "mimetype": mime,
                "fileSHA256": self.b64(32), "fileLength": str(rng.randrange(8_000, 6_000_000)),
                "mediaKey": self.b64(32), "fileEncSHA256": self.b64(32),
                "directPath": f"/v/t62.7118-24/{rng.randrange(10**8)}_{self.hexid(32).lower()}.enc?ccb=11-4",
                "mediaKeyTimestamp": str(ts // 1000 - rng.randrange(5, 60)),
            }
            if kind == "image":
                sub.update({"height": 1600, "width": 1200})
            if kind == "audio":
                sub.update({"seconds": rng.randrange(2, 120), "PTT": True})
            if kind == "document":
                sub.update({"fileName": f"{rng.choice(_THINGS).split()[-1]}.{ext}", "title": "document"})
            if body and kind != "audio":
                sub["caption"] = body
            if context:
                sub["contextInfo"] = context
            content = {f"{kind}Message": sub}
        elif context:
            content = {"extendedTextMessage": {"text": body, "contextInfo": context}}
        elif rng.random() < 0.3:
            content = {"extendedTextMessage": {"text": body}}
        else:
            content = {"conversation": body}
            if rng.random() < 0.5:
                content["messageContextInfo"] = {"deviceListMetadataVersion": 2,
                                                 "messageSecret": self.b64(32)}
        if conv.ephemeral:
            content = {"ephemeralMessage": {"message": content}}
        elif author is None and not conv.group and rng.random() < 0.3:
            content = {"deviceSentMessage": {"destinationJID": conv.cid, "message": content}}
        return content

    def whatsapp_message(self, conv: _Conv, author: _Person | None, t: int, body: str,
                         reply_to: _Msg | None, media: tuple | None) -> None:
        rng = self.rng
        ts = t // 1000 * 1000
        mid = self.wa_id(author.wa_id_style if author is not None else rng.randrange(3))
        msg = _Msg(mid, ts, author, body)
        content = self.wa_content(conv, author, body, reply_to, media, ts)
        recv = self.wa_recv(t)

        firsts: list[int] = []
        for ta, actor, emoji, action in self.reaction_plan(conv, author, t, 0.11):
            rid = self.wa_id(actor.wa_id_style if actor is not None else 0)
            reaction = {"key": self.wa_key(conv, msg), "text": "" if action == "remove" else emoji,
                        "senderTimestampMS": str(ta)}
            self.wa_frame(conv, actor, rid, ta // 1000 * 1000, {"reactionMessage": reaction},
                          self.wa_recv(ta))
            firsts.append(ta)
        x = rng.random()
        if body and x < 0.04:
            te = t + 8_000 + self.expo(3 * 60_000)
            edited = {"conversation": self.edited(body)} if rng.random() < 0.5 else \
                {"extendedTextMessage": {"text": self.edited(body)}}
            proto = {"editedMessage": {"message": {"protocolMessage": {
                "key": self.wa_key(conv, msg), "type": "MESSAGE_EDIT",
                "editedMessage": edited, "timestampMS": str(te)}}}}
            self.wa_frame(conv, author, self.wa_id(0), te // 1000 * 1000, proto, self.wa_recv(te))
            firsts.append(te)
        elif x < 0.055:
            td = t + 10_000 + self.expo(15 * 60_000)
            proto = {"protocolMessage": {"key": self.wa_key(conv, msg), "type": "REVOKE"}}
            self.wa_frame(conv, author, self.wa_id(0), td // 1000 * 1000, proto, self.wa_recv(td))
        if author is None:
            recipients = conv.members if not conv.group else rng.sample(conv.members, min(len(conv.members), 5))
            prev = [m.mid for m in conv.recent[-6:] if m.author is None]
            if rng.random() < 0.3:
                self.wa_receipt(conv, None, "sender", [mid], t + 500 + self.expo(2_000))
            for p in recipients:
                if rng.random() < 0.15:
                    continue
                td = t + 400 + self.expo(3_000)
                self.wa_receipt(conv, p, "", [mid], td)
                if rng.random() < 0.7:
                    tr = td + 20_000 + self.expo(40 * 60_000)
                    ids = [prev[-1], mid] if prev and rng.random() < 0.3 else [mid]
                    self.wa_receipt(conv, p, "played" if media and media[0] == "audio" else "read", ids, tr)
            if rng.random() < 0.02:
                self.wa_receipt(conv, conv.members[0], "retry", [mid], t + 1_500)
        elif rng.random() < 0.5:
            tr = t + 15_000 + self.expo(30 * 60_000)
            ids = [m.mid for m in conv.recent[-4:] if m.author is author and rng.random() < 0.4] + [mid]
            self.wa_receipt(conv, None, "read-self", ids, tr)
        self.remember(conv, msg)

        if firsts and rng.random() < LATE_MESSAGE_RATE:
            self.wa_frame(conv, author, mid, ts, content, min(firsts) + 300 + rng.randrange(8_000),
                          ("late",))
        else:
            self.wa_frame(conv, author, mid, ts, content, recv)

    def whatsapp_history(self, t: int) -> None:
        rng = self.rng
        convs = rng.sample(self.convs[WHATSAPP], min(len(self.convs[WHATSAPP]), rng.randint(2, 5)))
        items = []
        for conv in convs:
            base = t - rng.randrange(2, 30) * 86_400_000
            messages = []
            for _ in range(rng.randint(3, 15)):
                base += 5_000 + self.expo(20 * 60_000)
                author = None if rng.random() < 0.4 else rng.choice(conv.members)
                mid = self.wa_id(author.wa_id_style if author is not None else 1)
                body = self.body(conv)
                item = {"sender_jid": self.wa_jid(author, conv, device=False), "message_id": mid,
                        "timestamp_ms": base // 1000 * 1000, "is_from_me": author is None}
                if author is not None:
                    item["push_name"] = author.push_name
                if messages and rng.random() < 0.1:
                    target = messages[-1]
                    item["message"] = {"reactionMessage": {
                        "key": {"remoteJID": conv.cid, "fromMe": target["is_from_me"], "ID": target["message_id"]},
                        "text": self.reaction_emoji(), "senderTimestampMS": str(base)}}
                elif rng.random() < 0.3:
                    item["message"] = {"extendedTextMessage": {"text": body}}
                else:
                    item["message"] = {"conversation": body}
                messages.append(item)
            items.append({"chat_jid": conv.cid, "is_group": conv.group, "messages": messages})
        self.hist_chunk += 1
        payload = {"kind": "history_sync", "sync_type": "RECENT" if self.hist_chunk > 1 else "INITIAL_BOOTSTRAP",
                   "chunk_order": self.hist_chunk, "conversations": items}
        self.push(t + 800, WHATSAPP, f"hist:{self.hist_chunk}", _dumps(payload))

    # ------------------------------------------------------------------ Google

    def g_participant(self, p: _Person | None) -> dict:
        if p is None:
            return {"ID": {"type": "PHONE", "number": self.me.phone, "participantID": "1"},
                    "firstName": "", "fullName": "", "avatarHexColor": "#4285f4", "isMe": True,
                    "isVisible": True, "formattedNumber": self.me.phone, "bs": "1"}
        out = {"ID": {"type": "PHONE", "number": p.phone, "participantID": p.gpid},
               "firstName": p.contact_name.split()[0] if p.contact_name else "",
               "fullName": p.contact_name, "avatarHexColor": p.color, "isMe": False,
               "isVisible": True, "formattedNumber": _formatted(p.phone), "bs": "1"}
        if p.contact_id:
            out["contactID"] = p.contact_id
        return out

    def g_title(self, conv: _Conv) -> str:
        if not conv.group:
            return conv.members[0].contact_name or _formatted(conv.members[0].phone)
        if conv.title:
            return conv.title
        names = [p.contact_name.split()[0] if p.contact_name else _formatted(p.phone) for p in conv.members]
        return ", ".join(names[:3]) + (f" & {len(names) - 3} others" if len(names) > 3 else "")

    def google_conversation(self, conv: _Conv, t: int, *, resend: bool = False) -> None:
        rng = self.rng
        if resend and conv.g_last is not None and rng.random() < 0.6:
            key, payload = conv.g_last
        else:
            if resend:
                conv.unread = False
            c: dict[str, Any] = {"conversationID": conv.cid, "name": self.g_title(conv)}
            if conv.g_latest is not None:
                display, from_me, who, ts, mid = conv.g_latest
                c["latestMessage"] = {"displayContent": display, "fromMe": from_me, "displayName": who}
                c["lastMessageTimestamp"] = str(ts * 1000)
                c["unread"] = conv.unread
            else:
                c["lastMessageTimestamp"] = str((t - 3 * 86_400_000) * 1000)
            c.update({
                "isGroupChat": conv.group, "defaultOutgoingID": "1", "status": "ACTIVE",
                "readOnly": False, "avatarHexColor": conv.members[0].color,
            })
            if conv.g_latest is not None:
                c["latestMessageID"] = conv.g_latest[4]
            c["sendMode"] = "SEND_MODE_AUTO"
            c["participants"] = [self.g_participant(None)] + [self.g_participant(p) for p in conv.members]
            c["otherParticipants"] = [p.gpid for p in conv.members]
            c["type"] = "RCS" if conv.rcs else "SMS"
            body = _dumps(c)
            key = f"conv:{conv.cid}:{_hash8(body)}"
            payload = '{"kind":"conversation","conversation":' + body + "}"
            conv.g_last = (key, payload)
        sig = (conv.group, self.g_title(conv), tuple(p.idx for p in conv.members))
        conv.snapshot_sent = True
        self.push(t, GOOGLE, key, payload, ("gconv", conv.cid, sig))

    def google_refresh(self, t: int) -> None:
        """The app re-sends its conversation list, mostly unchanged."""
        sent = [c for c in self.convs[GOOGLE] if c.snapshot_sent]
        if not sent:
            return
        k = min(len(sent), self.rng.randint(3, 15))
        for i, conv in enumerate(sent[:k]):
            self.google_conversation(conv, t + 30 * i, resend=True)

    def google_roster_change(self, t: int) -> None:
        rng = self.rng
        groups = [c for c in self.convs[GOOGLE] if c.group]
        if not groups:
            return
        conv = rng.choice(groups)
        if len(conv.members) > 2 and rng.random() < 0.4:
            victim = rng.choice(conv.members)
            conv.members = [p for p in conv.members if p is not victim]
        elif len(conv.members) < 20:
            new = self.pick_people(1, lambda p: True, {p.idx for p in conv.members})
            for p in new:
                if not p.gpid:
                    self.g_pid += 1
                    p.gpid = str(self.g_pid)
            conv.members = conv.members + new
        self.google_conversation(conv, t)

    def google_title_change(self, t: int) -> None:
        groups = [c for c in self.convs[GOOGLE] if c.group]
        if not groups:
            return
        conv = self.rng.choice(groups)
        conv.title = self.rng.choice([x for x in _GROUP_TITLES if x != conv.title])
        self.google_conversation(conv, t)

    def google_message(self, conv: _Conv, author: _Person | None, t: int, body: str,
                       reply_to: _Msg | None, media: tuple | None) -> None:
        rng = self.rng
        self.g_mid += 1 + (rng.random() < 0.2) * rng.randrange(1, 4)
        mid = str(self.g_mid)
        micros = t * 1000 + rng.randrange(1000)
        msg = _Msg(mid, t, author, body)
        if not conv.snapshot_sent:
            self.google_conversation(conv, t - 50)
        from_me = author is None
        tmp_id = f"tmp_{rng.randrange(10**11, 10**12)}" if from_me else ""

        # a timeline of (time, field, value): status changes and reaction changes
        timeline: list[tuple] = []
        if from_me:
            timeline.append((t, "status", "OUTGOING_SENDING"))
            tc = t + 300 + self.expo(1_500)
            timeline.append((tc, "status", "OUTGOING_COMPLETE"))
            if rng.random() < 0.85:
                td = tc + 500 + self.expo(5_000)
                timeline.append((td, "status", "OUTGOING_DELIVERED"))
                if conv.rcs and rng.random() < 0.6:
                    timeline.append((td + 10_000 + self.expo(30 * 60_000), "status", "OUTGOING_DISPLAYED"))
        else:
            first = "INCOMING_AUTO_DOWNLOADING" if media is not None else "INCOMING_COMPLETE"
            timeline.append((t, "status", first))
            if media is not None:
                timeline.append((t + 800 + self.expo(4_000), "status", "INCOMING_COMPLETE"))
            if rng.random() < 0.25:
                timeline.append((t + 20_000 + self.expo(30 * 60_000), "status", "INCOMING_DISPLAYED"))
        for ta, actor, emoji, action in self.reaction_plan(conv, author, t, 0.12):
            timeline.append((ta, "reaction", (actor, emoji, action)))
        if rng.random() < 0.01:
            timeline.append((t + 30_000 + self.expo(20 * 60_000), "deleted", None))
        timeline.sort(key=lambda item: item[0])

        media_content = None
        if media is not None:
            kind, mime, ext = media
            media_content = {
                "format": {"image": "IMAGE_JPEG", "video": "VIDEO_MP4", "audio": "AUDIO_OGG"}.get(kind, "FILE"),
                "mediaID": self.b64(24).rstrip("="), "mediaName": f"PXL_{rng.randrange(10**7, 10**8)}.{ext}",
                "size": str(rng.randrange(20_000, 5_000_000)),
                "thumbnailMediaID": self.b64(12).rstrip("="),
                "decryptionKey": self.b64(32), "thumbnailDecryptionKey": self.b64(32),
                "mimeType": mime,
            }
        status = ""
        reactions: dict[Any, str] = {}  # actor -> emoji, in the order they reacted
        snapshots: list[tuple[int, str, str]] = []
        for when, what, value in timeline:
            if what == "status":
                status = value
            elif what == "deleted":
                status = "MESSAGE_DELETED"
            else:
                actor, emoji, action = value
                actor_key = "self" if actor is None else actor.idx
                if action == "remove":
                    reactions.pop(actor_key, None)
                else:
                    reactions.pop(actor_key, None)
                    reactions[actor_key] = emoji
            m: dict[str, Any] = {"messageID": mid, "msgType": {"type": "1"},
                                 "messageStatus": {"status": status}, "timestamp": str(micros),
                                 "conversationID": conv.cid,
                                 "participantID": "1" if from_me else author.gpid}
            if status == "MESSAGE_DELETED":
                m["messageInfo"] = []
            else:
                info = []
                if body:
                    info.append({"messageContent": {"content": body}})
                if media_content is not None:
                    info.append({"mediaContent": media_content})
                m["messageInfo"] = info
            m["type"] = "4" if conv.group else "1"
            m["tmpID"] = tmp_id
            if reply_to is not None:
                m["replyMessage"] = {"messageID": reply_to.mid, "conversationID": conv.cid,
                                     "replyMessageData": {}}
            if reactions and status != "MESSAGE_DELETED":
                m["reactions"] = self.g_reactions(conv, reactions)
            m["senderParticipant"] = self.g_participant(author)
            inner = _dumps(m)
            snapshots.append((when, f"msg:{mid}:{_hash8(inner)}", '{"kind":"message","message":' + inner + "}"))
            if status == "MESSAGE_DELETED":
                break

        display = body or "📷 Photo"
        conv.g_latest = (display[:80], "1" if from_me else "0",
                         "You" if from_me else (author.contact_name.split()[0] if author.contact_name else author.phone),
                         t, mid)
        conv.unread = not from_me
        self.remember(conv, msg)

        swap = -1
        if len(snapshots) >= 2 and rng.random() < STALE_SNAPSHOT_RATE:
            swap = rng.randrange(len(snapshots) - 1)
        for i, (when, key, payload) in enumerate(snapshots):
            recv = when + 250 + rng.randrange(1_200)
            if i == swap:
                nxt = snapshots[i + 1][0] + 250 + 1_500 + rng.randrange(4_000)
                self.push(nxt, GOOGLE, key, payload, ("stale",), recv)
            else:
                self.push(recv, GOOGLE, key, payload)
        if rng.random() < 0.55:
            self.google_conversation(conv, t + 600 + rng.randrange(2_000))

    def g_reactions(self, conv: _Conv, reactions: dict) -> list[dict]:
        by_emoji: dict[str, list[str]] = {}
        for actor_key, emoji in reactions.items():
            pid = "1" if actor_key == "self" else self.people[actor_key].gpid
            by_emoji.setdefault(emoji, []).append(pid)
        out = []
        for emoji, pids in by_emoji.items():
            if not conv.rcs and self.rng.random() < 0.3:
                pids = []  # SMS/MMS tapbacks do not always say who reacted
            out.append({"data": {"unicode": emoji, "type": _GOOGLE_REACTION_TYPE.get(emoji, "CUSTOM")},
                        "participantIDs": pids})
        return out

    # ------------------------------------------------------------------ malformed frames

    def malformed(self, base: list, prev_recv: int, next_recv: int) -> tuple[str, list]:
        """A frame the decoders must reject, made from ``base`` (a good frame)."""
        rng = self.rng
        codec, _, _, _, text = base
        recv = prev_recv + rng.randint(0, max(0, next_recv - prev_recv))
        x = rng.random()
        doc = json.loads(text)
        if x < 0.3:
            cut = rng.randint(len(text) // 3, len(text) - 1)  # a line cut short
            broken = text[:cut]
            key = f"line:{hashlib.sha256(broken.encode()).hexdigest()[:16]}" if codec == SIGNAL else ""
            return "truncated_json", [codec, 1, key, recv, _dumps(broken)]
        if x < 0.5:
            kind = "wrong_type"
            _wrong_type(codec, doc, rng)
        elif x < 0.7:
            kind = "missing_field"
            _missing_field(codec, doc)
        elif x < 0.82:
            alien = rng.choice(("telegram.tdlib", "google.protobuf", "signal.dbus", "imessage.bluebubbles"))
            return "unknown_codec", [alien, 1, "", recv, text]
        elif x < 0.92:
            return "bad_version", [codec, 2, "", recv, text]
        else:  # a JSON string holding valid JSON that is no object (the frame itself is fine)
            return "not_an_object", [codec, 1, "", recv, _dumps(_dumps([doc]))]
        return kind, [codec, 1, "", recv, _dumps(doc)]


def _wrong_type(codec: str, doc: dict, rng: random.Random) -> None:
    if codec == SIGNAL:
        env = doc["params"]["envelope"]
        if rng.random() < 0.5:
            env["timestamp"] = "2024-06-0" + str(rng.randrange(1, 10)) + "T12:00:00Z"
        else:
            doc["params"]["envelope"] = [env]
    elif codec == WHATSAPP:
        if doc.get("kind") == "history_sync":
            doc["conversations"] = {"0": doc["conversations"]}
        elif rng.random() < 0.5:
            doc["timestamp_ms"] = "yesterday"
        else:
            doc["kind"] = rng.choice(("presence", "chat_presence", "call_offer"))
    else:
        if doc["kind"] == "message":
            doc["message"]["timestamp"] = {"seconds": doc["message"]["timestamp"][:10]}
        else:
            doc["conversation"]["participants"] = {"list": doc["conversation"]["participants"]}


def _missing_field(codec: str, doc: dict) -> None:
    if codec == SIGNAL:
        del doc["params"]["envelope"]
    elif codec == WHATSAPP:
        if doc.get("kind") == "history_sync":
            del doc["conversations"][0]["chat_jid"]
        else:
            del doc["chat_jid"]
    else:
        del doc[doc["kind"]]["conversationID"]


def _hash8(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def _formatted(phone: str) -> str:
    if phone.startswith("+1") and len(phone) == 12:
        return f"({phone[2:5]}) {phone[5:8]}-{phone[8:]}"
    if phone.startswith("+44"):
        return f"0{phone[3:7]} {phone[7:]}"
    return phone


# --------------------------------------------------------------------------- entry points


def synthesize(frames: int, seed: int, progress: Callable[[int], None] | None = None) -> Corpus:
    """Build a corpus of exactly ``frames`` lines (without trailing newlines)."""
    if frames < 1:
        raise ValueError("frames must be at least 1")
    sim = _Sim(frames, seed)
    rng = sim.rng
    n_bad = int(frames * MALFORMED_RATE + 0.5)
    good = frames - n_bad
    sim.run(good, progress)
    frames_out = sim.out[:good]
    st = sim.stats
    # Malformed frames replace nothing: they are slotted in between good ones.
    positions = sorted(rng.sample(range(frames), n_bad)) if n_bad else []
    merged: list[list] = []
    gi = 0
    pi = 0
    for i in range(frames):
        if pi < len(positions) and positions[pi] == i:
            base = frames_out[max(0, gi - 1)] if frames_out else None
            prev_recv = merged[-1][3] if merged else START_MS
            next_recv = frames_out[gi][3] if gi < len(frames_out) else prev_recv + 1_000
            if base is None:  # pragma: no cover - frames >= 1 and good >= 1 always
                break
            kind, frame = sim.malformed(base, prev_recv, next_recv)
            merged.append(frame)
            st.malformed_by_type[kind] = st.malformed_by_type.get(kind, 0) + 1
            st.malformed_indices.append(i)
            pi += 1
        else:
            merged.append(frames_out[gi])
            gi += 1
    st.malformed = len(st.malformed_indices)
    st.frames = len(merged)
    lines = []
    per_codec: dict[str, int] = {}
    seen_max = 0
    out_of_order = 0
    keys: set[tuple[str, str]] = set()
    st.duplicates = st.empty_keys = 0
    for codec, version, key, recv, payload in merged:
        per_codec[codec] = per_codec.get(codec, 0) + 1
        if not key:
            st.empty_keys += 1
        elif (codec, key) in keys:
            st.duplicates += 1
        else:
            keys.add((codec, key))
        if recv < seen_max:
            out_of_order += 1
        seen_max = max(seen_max, recv)
        lines.append('{"codec":%s,"codec_version":%d,"dedupe_key":%s,"received_at_ms":%d,"payload":%s}'  # noqa: UP031 - the corpus writer's hot loop
                     % (_dumps(codec), version, _dumps(key), recv, payload))
    st.per_codec = dict(sorted(per_codec.items()))
    st.out_of_order = out_of_order
    st.first_received_at_ms = merged[0][3] if merged else 0
    st.last_received_at_ms = seen_max
    return Corpus(lines, st)


def run_synth(frames: int, seed: int, output: Path, out: Any, err: Any) -> int:
    """``tidings corpus synth``: write the corpus, print a one-line summary; the exit code."""
    from ..progress import progress_bar

    if frames < 1:
        err.print("error: --frames must be at least 1", markup=False, highlight=False)
        return 2
    output = Path(output)
    if not output.parent.exists():
        err.print(f"error: directory {output.parent} does not exist", markup=False, highlight=False)
        return 1
    started = time.perf_counter()
    with progress_bar(out, transient=True) as bar:
        task = bar.add_task("synthesising", total=frames, visible=frames >= 5_000)
        corpus = synthesize(frames, seed, lambda done: bar.update(task, completed=done))
        bar.update(task, completed=frames)
    tmp = output.with_name(output.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write("\n".join(corpus.lines))
            fh.write("\n")
        os.replace(tmp, output)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        err.print(f"error: cannot write {output}: {exc.strerror or exc}", markup=False, highlight=False)
        return 1
    st = corpus.stats
    codecs = ", ".join(f"{codec} {count:,}" for codec, count in st.per_codec.items())
    out.print(
        f"wrote {st.frames:,} frames to {output} (seed {seed}, {time.perf_counter() - started:.1f} s): "
        f"{codecs}; malformed {st.malformed:,}; duplicates {st.duplicates:,}; "
        f"empty keys {st.empty_keys:,}; out of order {st.out_of_order:,}; "
        f"unchanged Google snapshots {st.google_unchanged_snapshots:,}",
        markup=False, highlight=False, soft_wrap=True,
    )
    return 0
