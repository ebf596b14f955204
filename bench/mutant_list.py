"""The planted bugs of the mutation check (``bench/mutants.py``), one realistic bug each.

Each mutant is an exact text substitution in one source file, with the smallest test
selection that should catch it. Tests run on SQLite unless the mechanism is
backend-specific (``backend="both"``/``"postgres"``). Grouped as issue 5 lists them:
write guards, roster diff, recency, the reaction fence, the paging cursor, the drain and
its backoff, apply on append, the projection's own skips and merge rules, mutations and
reactions, decoders, the post path, the delivery side, and the backend-specific statements;
then later issues' mechanisms, ending with the batch of D115 (a request's projection rows read
once, changed in memory under a journal, written set-based): mutants of mechanisms D115
removed (reads announced ahead, statements sent per frame) were replaced by mutants of what
does their job now, each with a comment naming what it replaces.

Run: ``uv run python bench/mutants.py --jobs 2 --json bench/results/mutants.json``.
"""

from __future__ import annotations

from mutants import Mutant

# -- test files ----------------------------------------------------------------------------
GUARDS = "tests/ingest/test_guards.py"
PROJ = "tests/ingest/test_projection.py"
INBOX = "tests/ingest/test_inbox.py"
WORKER = "tests/ingest/test_worker.py"
APPEND = "tests/ingest/test_apply_on_append.py"
DECODERS = "tests/ingest/test_decoders.py"
API_CORE = "tests/test_api_core.py"
ROUND_TRIPS = "tests/test_round_trips.py"
BATCH = "tests/ingest/test_batch.py"
STUCK_RT = "test_frames_waiting_out_their_backoff_cost_a_later_frame_no_round_trip_and_a_retry_round_one_try"

# -- source files --------------------------------------------------------------------------
IDENT = "src/tidings/store/identities.py"
CONVS = "src/tidings/store/conversations.py"
BMSG = "src/tidings/store/bridge_messages.py"
REACT = "src/tidings/store/reactions.py"
INBOX_SRC = "src/tidings/store/inbox.py"
READCUR = "src/tidings/store/read_cursors.py"
BACKOFF = "src/tidings/ingest/backoff.py"
WORKER_SRC = "src/tidings/ingest/worker.py"
ON_APPEND = "src/tidings/ingest/on_append.py"
APPLY_SRC = "src/tidings/ingest/apply.py"
RETRY_SRC = "src/tidings/store/retry.py"
PROJ_SRC = "src/tidings/ingest/projection.py"
GOOGLE = "src/tidings/ingest/decoders/google_json.py"
POSTING = "src/tidings/hub/posting.py"
MESSAGES = "src/tidings/store/messages.py"
BATCH_SRC = "src/tidings/ingest/batch.py"
BATCH_ROWS_SRC = "src/tidings/store/batch_rows.py"


def g(name: str) -> str:
    return f"{GUARDS}::{name}"


def t(path: str, name: str) -> str:
    return f"{path}::{name}"


MUTANTS: list[Mutant] = []


def add(name: str, file: str, find: str, replace: str, *tests: str, why: str = "", k: str = "",
        backend: str = "sqlite") -> None:
    MUTANTS.append(Mutant(name, file, find, replace, tuple(tests), why, k, backend))


# == write guards: each term dropped on its own ===============================================
# D115: a batch's rules run in memory (the families' ``upsert``s compare the row read once);
# each term is dropped from that comparison. The SQL guard of each flush statement, the
# safety net behind it, is dropped whole below ("guard.sql.*").
_IDENT_TERMS = ["raw", "display_name", "is_self", "metadata"]
_CONV_TERMS = ["kind", "title", "remote_revision"]
_MSG_TERMS = [("sender_identity_id", "sender"), ("direction", "direction"), ("body", "body"),
              ("reply_to_remote_id", "reply_to"), ("occurred_at_ms", "occurred")]


def _compare_without(term: str, terms: list[str]) -> str:
    """``(have.a, have.b) == (a, b)``: the in-memory comparison of ``terms`` less ``term``."""
    kept = [t for t in terms if t != term]
    return f"({', '.join('have.' + t for t in kept)}) == ({', '.join(kept)})"


for col in _IDENT_TERMS:
    add(f"guard.identity.{col}", IDENT,
        "        if have.content() == (raw, display_name, is_self, metadata):\n",
        f"        if {_compare_without(col, _IDENT_TERMS)}:\n",
        g("test_every_identity_guard_column_changed_alone_writes_its_row"),
        why=f"the identity upsert no longer writes a change of {col} alone")

for col in _CONV_TERMS:
    add(f"guard.conversation.{col}", CONVS,
        "        if (have.kind, have.title, have.remote_revision) == (kind, title, remote_revision):\n",
        f"        if {_compare_without(col, _CONV_TERMS)}:\n",
        g("test_every_conversation_guard_column_changed_alone_writes_its_row"),
        why=f"the conversation upsert no longer writes a change of {col} alone")

for col, _param in _MSG_TERMS:
    add(f"guard.bridge_message.{col}", BMSG,
        '        if have.state != "active" or have.content() == (\n'
        "            sender_identity_id, direction, body, reply_to_remote_id, occurred_at_ms\n"
        "        ):\n",
        f'        if have.state != "active" or {_compare_without(col, [c for c, _ in _MSG_TERMS])}:\n',
        g("test_every_message_guard_column_changed_alone_writes_its_row"),
        why=f"a re-delivered message whose {col} alone changed is not updated")

# == the roster diff ========================================================================
add("roster.fast_path_ignores_display_name", CONVS,
    "        if stored.get(row.identity_id) != (row.role, row.display_name, bool(row.is_active)):",
    "        if (stored.get(row.identity_id) or (None, None, None))[0::2] != (row.role, bool(row.is_active)):",
    g("test_every_roster_column_changed_alone_writes_its_row"), g("test_changed_group_snapshot_writes_only_the_difference"),
    why="the unchanged-roster check ignores a column: a rename alone is never stored")
add("roster.diff_ignores_is_active", CONVS,
    "            if stored.get(identity_id) != values:\n",
    "            if (stored.get(identity_id) or (None, None, None))[:2] != values[:2]:\n",
    g("test_every_roster_column_changed_alone_writes_its_row"),
    why="the diff compares role and name only: a member going inactive is never stored")
add("roster.never_deletes", CONVS,
    "            if identity_id not in wanted:\n                self._set(conversation_id, identity_id, None)\n",
    "            if False:\n                self._set(conversation_id, identity_id, None)\n",
    g("test_changed_group_snapshot_writes_only_the_difference"),
    why="a member who left stays on the roster")
add("roster.fast_path_accepts_repeat", CONVS,
    "        if row.identity_id in seen:\n            return False\n", "",
    g("test_roster_sync_rejects_a_repeated_identity_even_when_the_count_matches"),
    why="the reference's survivor: a roster repeating an identity matches on the fast path")
add("roster.diff_accepts_repeat", CONVS,
    '            if row.identity_id in wanted:\n'
    '                raise RosterError(f"identity {row.identity_id!r} appears twice in the roster")\n',
    "",
    g("test_roster_sync_rejects_a_repeated_identity_even_when_the_count_matches"),
    why="the slow path merges a repeated identity silently")
add("roster.never_touches_conversation", CONVS,
    "        if written and touched_at_ms > 0:\n            self.conversations.touch(",
    "        if False:\n            self.conversations.touch(",
    g("test_changed_group_snapshot_writes_only_the_difference"),
    why="a roster-only change leaves the conversation's updated_at_ms behind")
add("roster.touch_moves_backwards", CONVS,
    "        if have is None or have.updated_at_ms >= now:\n            return 0\n",
    "        if have is None:\n            return 0\n",
    g("test_roster_touch_never_moves_updated_at_backwards"),
    why="a replayed (older) clock moves updated_at_ms backwards")
add("refresh.never_touches", PROJ_SRC,
    "rows=rows, touched_at_ms=self.now", "rows=rows, touched_at_ms=0",
    g("test_changed_group_snapshot_writes_only_the_difference"),
    why="the reference's 'touchedAtMS = 0': the projection never asks for the roster touch")
add("roster.every_sender_joins", PROJ_SRC,
    "            if sender_roster and incoming and not sender[3]:\n",
    "            if sender_roster:\n",
    t(PROJ, "test_outgoing_message_keeps_roster_to_the_peers"),
    why="our own outgoing messages put us on every Signal/WhatsApp roster")

# == recency ================================================================================
add("recency.bump_on_equal", CONVS,
    "        if have.last_message_at_ms >= at_ms:\n", "        if have.last_message_at_ms > at_ms:\n",
    g("test_recency_bump_writes_only_when_strictly_newer"),
    why="an equal-time message rewrites the recency row")
# Replaces recency.mint_or_bump_on_equal: the message path's own recency statement is gone
# (D115); its one mint-or-bump per conversation now takes the frame's newest message time here,
# and the equal-time rule is Conversations.mint_or_bump's alone (recency.bump_on_equal).
add("recency.frame_takes_its_last_message_time", PROJ_SRC,
    "            if at is None or ev.occurred_at_ms > at:\n", "            if True:\n",
    t(PROJ, "test_group_remote_id_mints_a_group_and_recency_only_moves_forward"),
    why="a frame's one mint-or-bump per conversation takes its last message's time, not its newest: "
        "a frame whose messages come newest first leaves recency behind")
add("recency.moves_backwards", CONVS,
    "        if have.last_message_at_ms >= at_ms:\n            return 0\n", "",
    t(PROJ, "test_group_remote_id_mints_a_group_and_recency_only_moves_forward"),
    why="an older message, retried late, moves recency back")

# == the reaction fence =====================================================================
add("fence.sql_unguarded", REACT,
    '"updated_at_ms = excluded.updated_at_ms WHERE excluded.source_seq_ms > reaction_fences.source_seq_ms",',
    '"updated_at_ms = excluded.updated_at_ms",',
    g("test_every_write_statement_is_guarded_in_sql"),
    why="the fence statement overwrites whatever it finds (the safety net is gone)")
add("fence.write_at_its_own_sequence", REACT,
    "        if current_fence is None or source_seq_ms > current_fence:\n"
    "            fence_written = self.advance_fence(message_id, source_seq_ms, now)\n",
    "        if current_fence is None or source_seq_ms >= current_fence:\n"
    "            self.fences.put(message_id, (source_seq_ms, now))\n"
    "            fence_written = 1\n",
    g("test_unchanged_writes_touch_no_rows"),
    g("test_repeated_google_message_frame_writes_only_the_fence_when_newer"),
    why="the fence write at the fence's own sequence is no longer skipped (the batch's own check; the "
        "flush and the SQL guard still keep the row, but the frame reports a write it never made)")
add("fence.accepts_older_snapshot", REACT,
    "        if current_fence is not None and source_seq_ms < current_fence:\n            return SnapshotResult(",
    "        if False:\n            return SnapshotResult(",
    g("test_older_google_reaction_snapshot_cannot_override_a_newer_empty_one"),
    why="an older snapshot retried late brings a removed reaction back")
add("fence.rejects_equal_snapshot", REACT,
    "source_seq_ms < current_fence:", "source_seq_ms <= current_fence:",
    g("test_snapshot_at_the_fence_sequence_is_accepted_and_its_fence_write_skipped"),
    why="a second message of the same frame's sequence is dropped whole")
add("fence.audit_skip_empty_snapshot", REACT,
    "        if current_fence is None or source_seq_ms > current_fence:\n            fence_written",
    "        if (entries or current_fence is not None) and (current_fence is None or source_seq_ms > current_fence):\n"
    "            fence_written",
    g("test_older_google_reaction_snapshot_cannot_override_a_newer_empty_one"),
    why="the audit's suggestion: skip the fence write of an empty snapshot when no fence exists")
add("fence.audit_skip_empty_frame", PROJ_SRC,
    "    if reacts or frame.snapshots:\n", "    if reacts:\n",
    g("test_older_google_reaction_snapshot_cannot_override_a_newer_empty_one"),
    why="the same skip in the projection: a Google frame without reactions applies no snapshot")
add("snapshot.never_tombstones", REACT,
    '            if have.state == "active" and reactor_key not in entries:',
    "            if False:",
    g("test_snapshot_writes_only_changed_reactions_and_tombstones_absent_ones"),
    why="a reaction absent from a newer snapshot stays active")

# == the inbox paging cursor =================================================================
add("cursor.repeats", INBOX_SRC,
    "(received_at_ms, inbox_id) > (:after_ms, :after_id)", "(received_at_ms, inbox_id) >= (:after_ms, :after_id)",
    t(INBOX, "test_paging_visits_every_frame_once_in_order_with_ties"),
    why="`>=`: each page starts with the previous page's last frame")
add("cursor.orders_by_id_only", INBOX_SRC,
    '"ORDER BY received_at_ms, inbox_id LIMIT :limit",\n    name="inbox.unprocessed_after"',
    '"ORDER BY inbox_id LIMIT :limit",\n    name="inbox.unprocessed_after"',
    t(INBOX, "test_paging_visits_every_frame_once_in_order_with_ties"),
    why="the page is ordered differently from the cursor: frames are skipped")

# == the drain and its backoff ==============================================================
add("backoff.none", BACKOFF,
    "entry.not_before_ms = now_ms + retry_delay_ms(entry.failures, self.base_ms, self.max_ms)",
    "entry.not_before_ms = now_ms",
    t(WORKER, "test_deferred_frame_is_passed_over_until_its_time_then_backs_off_doubling"),
    why="a stuck frame is re-decoded on every later frame (the reference's 686 ms per frame)")
add("backoff.no_doubling", BACKOFF, "    delay = base_ms << shift\n", "    delay = base_ms\n",
    t(WORKER, "test_backoff_is_capped"),
    t(WORKER, "test_deferred_frame_is_passed_over_until_its_time_then_backs_off_doubling"),
    why="the backoff stays at 1 s forever")
add("backoff.no_cap", BACKOFF, "    if delay <= 0 or delay > max_ms:", "    if delay <= 0:",
    t(WORKER, "test_backoff_is_capped"),
    why="the backoff grows past 5 min")
add("drain.no_prune", WORKER_SRC,
    "        stats.pruned = retries.prune(listed_retries)", "        stats.pruned = 0",
    t(WORKER, "test_backoff_rounds_are_capped_and_entries_of_frames_processed_elsewhere_are_pruned"),
    why="retry entries of frames processed elsewhere stay in memory forever")
add("drain.prunes_just_deferred", WORKER_SRC,
    "            self.retries.defer(inbox_id, self.clock.now_ms())\n            self._listed_retries.append(inbox_id)\n",
    "            self.retries.defer(inbox_id, self.clock.now_ms())\n",
    t(WORKER, "test_deferred_frame_is_passed_over_until_its_time_then_backs_off_doubling"),
    why="a frame deferred during the walk is pruned at its end, so it never waits")
add("drain.single_page", WORKER_SRC,
    "            if len(page) < self.page_size:\n                break",
    "            if True:\n                break",
    t(WORKER, "test_drain_applies_a_paged_backlog_in_receipt_order_once_each"),
    why="a drain reads one page of 256 and stops")
add("drain.no_deferral_skip", WORKER_SRC,
    "                    if retries.waiting(inbox_id, now):", "                    if False:",
    t(WORKER, "test_deferred_frame_is_passed_over_until_its_time_then_backs_off_doubling"),
    t(ROUND_TRIPS, STUCK_RT),
    why="a deferred frame is loaded and decoded before its time")
add("drain.exhausted_frame_not_deferred", WORKER_SRC,
    "            self.retries.defer(inbox_id, self.clock.now_ms())", "            pass",
    t(WORKER, "test_deferred_frame_is_passed_over_until_its_time_then_backs_off_doubling"),
    why="the reference's 'an exhausted frame not deferred'")
add("wake.no_timer", WORKER_SRC,
    "            return self._pause_until\n        return self.retries.earliest()",
    "            return self._pause_until\n        return None",
    t(WORKER, "test_running_worker_drains_on_append_and_wakes_for_its_retry_on_a_fake_clock"),
    why="no traffic, no retry: a deferred frame waits for the next append")
add("wake.real_clock_waits_forever", WORKER_SRC,
    "        return max(0.0, (when - self.clock.now_ms()) / 1000.0)", "        return None",
    t(WORKER, "test_running_worker_wakes_for_its_retry_on_the_real_clock"),
    why="with the real clock the run loop never times out for its retry")
add("retry.backed_off_frame_gets_every_try", BACKOFF, "RETRY_ROUND_TRIES = 1\n", "RETRY_ROUND_TRIES = ATTEMPTS\n",
    t(WORKER, "test_a_backed_off_frame_gets_one_try_per_retry_round_without_in_attempt_sleeps"),
    t(ROUND_TRIPS, STUCK_RT),
    why="each retry round of a stuck frame is 4 tries 5/10/20 ms apart: 4 loads and decodes, 35 ms of sleep")
add("retry.backed_off_frame_retried_inside_a_group", WORKER_SRC,
    "                    self._finish(inbox_id, self._process_one(inbox_id), stats, on_frame)\n"
    "                    continue\n",
    "",
    t(WORKER, "test_a_backed_off_frame_gets_one_try_per_retry_round_without_in_attempt_sleeps"),
    k="group8",
    why="a due stuck frame joins a drain group: its failure ends the group and the frames after it go one by one")
add("retry.no_in_attempt_retries", BACKOFF, "ATTEMPTS = 4\n", "ATTEMPTS = 1\n",
    t(WORKER, "test_transient_failure_in_the_reactions_step_leaves_the_frame_untouched_then_applies_fully"),
    why="one busy error defers the frame for a second")
add("quarantine.transient_is_deterministic", RETRY_SRC,
    "            if not is_transient(exc):\n                raise\n            reconnect_if_broken(conn)",
    "            if True:\n                raise\n            reconnect_if_broken(conn)",
    t(WORKER, "test_fault_ingest_busy_fails_the_next_n_attempts"),
    why="a busy database quarantines the frame for good")

# == apply on append ========================================================================
add("append.order_check_removed", ON_APPEND,
    "    if len(older) > deferred:\n        return True\n",
    "    return False\n",
    t(APPEND, "test_new_frames_wait_behind_an_older_unprocessed_frame_of_their_bridge"),
    why="a new frame applies before an older unprocessed frame of its bridge (out of receipt order)")
add("append.backoff_holds_everything_up", ON_APPEND,
    "    return not all(retries.waiting(i, now) for i in older)", "    return bool(older)",
    t(APPEND, "test_a_frame_waiting_out_its_backoff_does_not_hold_up_later_frames"),
    t(ROUND_TRIPS, STUCK_RT),
    why="one stuck frame sends every later append to the drain")
add("append.transient_is_deterministic", ON_APPEND,
    "        if is_transient(error):\n            log.info(", "        if False:\n            log.info(",
    t(APPEND, "test_a_transient_failure_leaves_the_frame_and_the_rest_of_its_request_to_the_worker"),
    why="a busy error on append quarantines the frame")
add("append.keeps_applying_after_a_left_frame", ON_APPEND,
    "            if outcome == LEFT:\n                self.applying = False\n",
    "            if outcome == LEFT:\n",
    t(APPEND, "test_a_transient_failure_leaves_the_frame_and_the_rest_of_its_request_to_the_worker"),
    why="frames after one left to the drain apply before it")

# == the projection's own skips and merge rules ==============================================
# The reference's skips are the families' guards now (one comparison, D115): planted there.
add("skip.identity_ignores_self", IDENT,
    "        if have.content() == (raw, display_name, is_self, metadata):\n",
    f"        if {_compare_without('is_self', _IDENT_TERMS)}:\n",
    t(PROJ, "test_identity_merge_rule_column_by_column"),
    why="the reference's mutant: an identity seen as self later is never marked self")
add("skip.identity_ignores_raw", IDENT,
    "        if have.content() == (raw, display_name, is_self, metadata):\n",
    f"        if {_compare_without('raw', _IDENT_TERMS)}:\n",
    t(PROJ, "test_identity_merge_rule_column_by_column"),
    why="the reference's mutant: a new spelling of the same number is never stored")
add("merge.blank_name_erases", PROJ_SRC,
    "        new_name = name or stored.display_name", "        new_name = name",
    t(PROJ, "test_identity_merge_rule_column_by_column"),
    why="a sighting without a name erases the known name")
add("merge.self_turns_off", PROJ_SRC,
    "        new_self = stored.is_self or ref.is_self", "        new_self = ref.is_self",
    t(PROJ, "test_identity_merge_rule_column_by_column"),
    why="is_self only turns on; here a later sighting turns it off")
add("skip.conversation_ignores_revision", CONVS,
    "        if (have.kind, have.title, have.remote_revision) == (kind, title, remote_revision):\n",
    f"        if {_compare_without('remote_revision', _CONV_TERMS)}:\n",
    t(PROJ, "test_conversation_refresh_column_by_column"),
    why="the reference's mutant: a revision-only change is never stored")
add("order.mutations_before_messages", PROJ_SRC,
    "    if msgs:\n        frame.messages(msgs)\n    for ev in muts:\n        frame.mutation(ev)\n",
    "    for ev in muts:\n        frame.mutation(ev)\n    if msgs:\n        frame.messages(msgs)\n",
    t(PROJ, "test_events_apply_in_kind_order_whatever_the_decoded_order"),
    why="an edit decoded before its message in one frame is orphaned")
add("projection.counts_before_commit", PROJ_SRC,
    "        tx.after_commit(add_counts)", "        add_counts()",
    t(PROJ, "test_counters_are_added_only_when_the_frame_commits"),
    why="a rolled-back frame's counts are reported")

# == messages, mutations, reactions, receipts =================================================
add("redelivery.undoes_edit", BMSG,
    '        if have.state != "active" or have.content() == (', "        if have.content() == (",
    t(PROJ, "test_redelivered_message_writes_nothing_and_never_undoes_an_edit_or_delete"),
    why="a re-delivered original overwrites an edit or resurrects a deleted body")
add("edit.older_wins", BMSG,
    "mutated is None or mutated < at_ms or (", "mutated is None or mutated != at_ms or (",
    t(PROJ, "test_edits_are_last_writer_wins_and_a_delete_is_terminal"),
    why="an older edit retried late overwrites a newer one")
add("edit.revives_deleted", BMSG,
    '        if have is None or have.state == "deleted":\n            return None\n        mutated = ',
    "        if have is None:\n            return None\n        mutated = ",
    t(PROJ, "test_edits_are_last_writer_wins_and_a_delete_is_terminal"),
    why="a delete is not terminal: a later edit brings the message back")
add("delete.keeps_body", BMSG,
    'self.table.put(id, have._replace(body="", state="deleted",', 'self.table.put(id, have._replace(state="deleted",',
    t(PROJ, "test_redelivered_message_writes_nothing_and_never_undoes_an_edit_or_delete"),
    why="a deleted message's text stays readable (the reference kept the body)")
add("delta.equal_time_always_writes", REACT,
    "(occurred_at_ms == have.occurred_at_ms and not (", "(False and not (",
    t(PROJ, "test_equal_time_reaction_writes_only_when_content_differs"),
    why="a re-delivered reaction rewrites its row")
add("delta.older_wins", REACT,
    "        if occurred_at_ms < have.occurred_at_ms or (", "        if (",
    t(PROJ, "test_delta_reactions_last_writer_wins_with_tombstones"),
    t(PROJ, "test_remove_before_add_leaves_a_tombstone_that_fences_the_stale_add"),
    why="a stale add delivered after a removal brings the reaction back")
add("read_cursor.moves_backwards", READCUR,
    "if have is not None and (message_at_ms, message_id) <= (", "if have is not None and (message_at_ms, message_id) == (",
    t(PROJ, "test_read_cursor_moves_on_self_read_receipts_only_and_only_forwards"),
    why="a late receipt for an older message moves our read cursor back")
add("receipt.others_move_our_cursor", PROJ_SRC,
    '        if ev.status != "read" or not ev.actor.is_self:', '        if ev.status != "read":',
    t(PROJ, "test_read_cursor_moves_on_self_read_receipts_only_and_only_forwards"),
    why="someone else's read receipt marks the conversation read for us")
add("receipt.no_lookup_by_remote_id", PROJ_SRC,
    "            if at is None and self.platform in RECEIPTS_LOCATE_BY_REMOTE_ID:",
    "            if False:",
    t(PROJ, "test_signal_read_sync_finds_a_group_message_by_its_remote_id"),
    why="a Signal group message read on another device never moves the group's read cursor")
add("receipt.ambiguous_remote_id_places", BMSG,
    "        if len(found) != 1:\n            return None\n", "        if not found:\n            return None\n",
    t(PROJ, "test_signal_read_sync_finds_a_group_message_by_its_remote_id"),
    why="a read naming an id two conversations hold moves one of them at random")
add("receipt.lookup_off_signal", PROJ_SRC,
    'RECEIPTS_LOCATE_BY_REMOTE_ID = frozenset({"signal"})',
    'RECEIPTS_LOCATE_BY_REMOTE_ID = frozenset({"signal", "whatsapp", "google"})',
    t(PROJ, "test_a_read_receipt_never_crosses_conversations_off_signal"),
    why="a WhatsApp receipt for one chat marks another chat's message read")

# == conversation paging ======================================================================
add("paging.ties_skipped_messages", BMSG,
    '"WHERE m.conversation_id = :conversation_id AND (m.occurred_at_ms, m.id) < (:before_ms, :before_id) "',
    '"WHERE m.conversation_id = :conversation_id AND m.occurred_at_ms < :before_ms AND :before_id = :before_id "',
    "tests/ingest/test_api_conversations.py::test_paging_with_the_answers_cursor_sees_every_message_once_through_equal_times",
    why="paging a conversation with the answer's cursor skips the rest of a millisecond")
add("paging.ties_skipped_conversations", CONVS,
    '"WHERE bridge_id = :bridge_id AND (last_message_at_ms, id) < (:before_ms, :before_id) "',
    '"WHERE bridge_id = :bridge_id AND last_message_at_ms < :before_ms AND :before_id = :before_id "',
    "tests/ingest/test_api_conversations.py::test_paging_with_the_answers_cursor_sees_every_message_once_through_equal_times",
    why="paging a bridge's conversations skips the rest of a millisecond")

# == decoders ===============================================================================
add("google.microseconds_kept", GOOGLE,
    "        occurred = micros // 1000\n", "        occurred = micros\n",
    t(DECODERS, "test_fixture_decodes_to_exact_events"),
    why="Google's microsecond timestamps stored as milliseconds (dates in the year 50,000)")

# == the post path ===========================================================================
add("posting.empty_crid_is_a_key", MESSAGES,
    "\"AND m.client_request_id = :client_request_id AND m.client_request_id <> '' \"",
    "\"AND m.client_request_id = :client_request_id \"",
    t(API_CORE, "test_post_and_list_messages"),
    why="every post without a client_request_id returns the author's first such post")
add("posting.lost_race_commits_its_seq", POSTING,
    "        if taken is None:  # a concurrent post with the same client_request_id won\n            raise _Duplicate()\n",
    "        if taken is None:  # a concurrent post with the same client_request_id won\n"
    "            return messages_store.by_client_request(tx, author_id, crid) or {}, False\n",
    t("tests/test_posting.py",
      "test_a_post_that_loses_the_client_request_race_returns_the_stored_message_and_leaves_no_gap"),
    why="a post that loses the client request race commits the channel_seq its insert took: a gap",
    backend="both")
add("posting.seq_read_outside_the_lock", MESSAGES,
    "(SELECT last_seq FROM next)", "(SELECT last_seq + 1 FROM channels WHERE id = :channel_id)",
    t("tests/test_posting.py", "test_a_post_that_waited_for_the_channel_lock_takes_the_seq_after_the_one_that_held_it"),
    t("tests/test_posting.py", "test_concurrent_posts_get_gap_free_channel_seqs_and_a_pager_never_skips"),
    why="the insert's channel_seq is read from the statement's snapshot, not from the locked update",
    backend="postgres")
add("posting.alone_skips_the_outbox", POSTING,
    "            if ctx.topic_id is None or ctx.channel[\"linked\"]:\n",
    "            if ctx.topic_id is None:\n",
    t("tests/bridges/test_outbox.py", "test_a_linked_post_its_checking_statement_did_not_take_still_queues_its_send"),
    why="the one-statement post takes a linked channel's post too, and its outbox row is never queued",
    backend="postgres")
add("postgate.member_unchecked", MESSAGES,
    "\"AND EXISTS (SELECT 1 FROM channel_members cm WHERE cm.channel_id = c.id AND cm.account_id = :author) \"\n"
    "    \"AND NOT EXISTS (SELECT 1 FROM bridge_links l",
    "\"AND NOT EXISTS (SELECT 1 FROM bridge_links l",
    t("tests/test_posting.py", "test_a_post_its_one_statement_does_not_admit_gets_the_answer_of_its_reads"),
    why="the one-statement post stores a stranger's post in a channel it is not a member of",
    backend="postgres")
add("postgate.policy_unchecked", MESSAGES,
    "\"AND (c.post_policy <> 'owner_only' OR c.owner_account_id = :author) \"",
    "\"\"",
    t("tests/test_posting.py", "test_a_post_its_one_statement_does_not_admit_gets_the_answer_of_its_reads"),
    why="the one-statement post ignores an owner-only channel's post policy",
    backend="postgres")
add("postgate.linked_unchecked", MESSAGES,
    "\"AND NOT EXISTS (SELECT 1 FROM bridge_links l WHERE l.channel_id = c.id) \"",
    "\"\"",
    t("tests/bridges/test_outbox.py",
      "test_a_person_post_in_a_linked_channel_queues_one_send_and_an_inbound_post_queues_none"),
    why="the one-statement post takes a linked channel's post, and its outbox row is never queued",
    backend="postgres")
add("postgate.seq_read_outside_the_lock", MESSAGES,
    "\"SELECT :id, :channel_id, next.last_seq, admitted.topic_id,",
    "\"SELECT :id, :channel_id, (SELECT last_seq + 1 FROM channels WHERE id = :channel_id), admitted.topic_id,",
    t("tests/test_posting.py", "test_concurrent_posts_get_gap_free_channel_seqs_and_a_pager_never_skips"),
    why="the one-statement post's channel_seq is read from the statement's snapshot, not from the locked update",
    backend="postgres")
add("posting.alone_duplicate_not_recognised", MESSAGES,
    "            return None\n        raise\n",
    "            raise\n        raise\n",
    t("tests/test_posting.py",
      "test_a_post_that_loses_the_client_request_race_returns_the_stored_message_and_leaves_no_gap"),
    why="a one-statement post that loses the client request race fails instead of returning the stored row",
    backend="postgres")
add("batch.consumer_read_columns_shifted", "src/tidings/store/delivery.py",
    "channel_agent(r[_MESSAGE_WIDTH + 2:])", "channel_agent(r[_MESSAGE_WIDTH + 1:])",
    t("tests/delivery/test_batching.py", "test_an_example_batch_with_every_path_in_it"),
    why="the consumer's one-statement read takes each agent from the wrong columns (mentions miss)",
    backend="both")
add("batch.consumer_read_first_channel_only", "src/tidings/delivery/routing.py",
    "[e.channel_id for e in fanning]", "[e.channel_id for e in fanning[:1]]",
    t("tests/delivery/test_batching.py", "test_the_consumer_reads_and_flushes_a_batch_in_two_statements"),
    why="the batch reads the agents of one channel only; the others are read message by message",
    backend="both")
add("posting.crid_reused_in_another_channel", POSTING,
    "            if existing[\"channel_id\"] != channel_id:\n"
    "                raise BadRequest(\"client_request_id was already used for another channel\", code=\"crid_reused\")\n"
    "            return existing\n",
    "            return existing\n",
    t(API_CORE, "test_client_request_id_is_per_author_and_bound_to_its_channel"),
    why="a retry aimed at another channel silently returns a message from the first")
add("messages.crid_ignores_author", MESSAGES,
    "LEFT JOIN messages m ON m.author_account_id = :author ",
    "LEFT JOIN messages m ON true ",
    t(API_CORE, "test_client_request_id_is_per_author_and_bound_to_its_channel"),
    why="two authors using the same request id: the second gets the first's message")

# == the delivery side ======================================================================
DCURS = "tests/delivery/test_cursors.py"
DREC = "tests/delivery/test_recovery.py"
DOFF = "tests/delivery/test_offline_mentions.py"
DMENT = "tests/delivery/test_mentions.py"
DCORE = "tests/delivery/test_consumer_core.py"
DSWEEP = "tests/delivery/test_sweeps_and_settle.py"
DWAKE = "tests/delivery/test_wakers.py"
CONSUMER = "src/tidings/delivery/consumer.py"
ROUTING = "src/tidings/delivery/routing.py"
SCAN = "src/tidings/delivery/scan.py"
SWEEPS = "src/tidings/delivery/sweeps.py"
UNIT = "src/tidings/delivery/unit.py"
MENTIONS = "src/tidings/delivery/mentions.py"
WAKERS = "src/tidings/delivery/wakers.py"
DSTORE = "src/tidings/store/delivery.py"
CURSORS = "src/tidings/store/cursors.py"
SWEEP_STORE = "src/tidings/store/sweep.py"
OWED_STORE = "src/tidings/store/owed.py"

add("route.mark_before_route", ROUTING,
    "            if self.options.mark_on_route_failure:\n                self.unit.mark(row)\n",
    "            self.unit.mark(row)\n",
    t(DREC, "test_a_periodic_scan_recovers_a_failed_pass_without_a_restart"),
    why="reference flaw O4: a failed mention pass still marks its message routed, so no scan retries it")
add("scan.held_skip_removed", SCAN,
    "                if message_id in self.held_ids or (", "                if False or (",
    t(DREC, "test_scan_skips_a_message_held_right_now_and_leaves_it_unmarked"),
    why="the scan routes a held message before its author settles")
add("sweep_set.no_home_channel", SWEEP_STORE,
    'f"OR {account}.home_channel_id = {channel}.id)"', 'f")"',
    t(DCURS, "test_home_channel_is_swept_even_with_the_flag_off"),
    why="drift of the one sweep-set predicate: the home channel drops out when its flag is off")
add("sweep_set.no_mandatory", SWEEP_STORE,
    'f"({member}.subscribed OR {channel}.mandatory_subscription "', 'f"({member}.subscribed "',
    t(DCURS, "test_home_channel_is_swept_even_with_the_flag_off"),
    t(DOFF, "test_agents_ping_owes_only_the_members_outside_their_sweep_set"),
    why="drift of the one sweep-set predicate: a mandatory channel is not swept")
add("owed.record_skipped", ROUTING,
    "                    self.unit.owe(message_id, agent.id, channel_id)\n", "                    pass\n",
    t(DOFF, "test_offline_member_outside_the_sweep_set_gets_an_owed_row_and_a_wake"),
    why="a mention outside the sweep set is never owed: an offline agent never hears of it")
add("owed.only_when_offline", ROUTING,
    "if not agent.in_sweep and (session is None or self.options.owe_live_gap):",
    "if not agent.in_sweep and session is None:",
    t(DOFF, "test_a_refused_steer_to_a_live_member_outside_the_sweep_set_is_owed"),
    why="reference flaw O1: a live agent's refused steer has no backstop")
add("owed.recording_reopens_acked", OWED_STORE,
    "\"FROM json_each(:rows) WHERE true ON CONFLICT (agent_id, message_id) DO NOTHING\"",
    "\"FROM json_each(:rows) WHERE true ON CONFLICT (agent_id, message_id) DO UPDATE SET acked_at_ms = NULL\"",
    t(DCURS, "test_an_ack_before_the_mention_pass_commits_is_never_undone"),
    why="a later pass (retried flush, scan, settle) owes an acked mention again")
add("ack.forgets_owed_row", CURSORS,
    '    cleared = has_row and tx.rowcount(ACK_OWED, {**keys, "now": now}) == 1',
    "    cleared = has_row",
    t(DCURS, "test_ack_clears_the_owed_row_even_without_a_cursor"),
    why="the ack never clears the owed row: the mention is steered at every start forever")
add("ack.no_tombstone_outside_sweep_set", CURSORS,
    '        tx.execute(ACKED_TOMBSTONE, {**keys, "channel_id": channel_id, "now": now})',
    "        pass",
    t(DCURS, "test_an_ack_before_the_mention_pass_commits_is_never_undone"),
    why="an ack that beats the mention pass's commit is undone by it")
add("cursor.steps_over_others_seqs", CURSORS,
    '"SELECT channel_seq FROM messages WHERE author_account_id = :agent_id AND channel_id = :channel_id "',
    '"SELECT channel_seq FROM messages WHERE channel_id = :channel_id "',
    t(DCURS, "test_out_of_order_acks_fold_into_the_mark"),
    why="the contiguous advance steps over any visible seq, not only the agent's own")
add("cursor.high_water_mark", CURSORS,
    "    while acked_seq + 1 in above or acked_seq + 1 in own:\n        acked_seq += 1\n",
    "    acked_seq = max([acked_seq, *above, *own])\n",
    t(DCURS, "test_advance_is_pure_and_never_crosses_a_gap"), t(DCURS, "test_out_of_order_acks_fold_into_the_mark"),
    why="a single high-water mark: an earlier unacked message is skipped")
add("fan_out.mentioned_also_delivered", ROUTING,
    "if agent.id == author or not agent.in_sweep or agent.id in mentioned:",
    "if agent.id == author or not agent.in_sweep:",
    t(DMENT, "test_a_mentioned_live_subscriber_gets_exactly_one_steer_and_no_deliver"),
    t(DMENT, "test_a_mentioned_subscriber_gets_only_the_steer_even_when_its_floor_is_behind"),
    why="steer-only precedence removed: a mentioned subscriber gets the steer and the deliver")
add("fan_out.routed_message_routed_again", ROUTING,
    '        if row.get("mentions_routed_at") is None:\n            mentioned = self.route_mentions_for(',
    '        if True:\n            mentioned = self.route_mentions_for(',
    t(DMENT, "test_a_mentioned_subscriber_gets_only_the_steer_even_when_its_floor_is_behind"),
    why="a message the scan already routed is routed again when its live event arrives: a second steer")
add("settle.not_on_session_end", CONSUMER,
    "        if self.options.settle_on_end:\n            self.router.fire_held(session.session_id, session.agent_id)",
    "        if False:\n            self.router.fire_held(session.session_id, session.agent_id)",
    t(DSWEEP, "test_ending_a_session_fires_only_that_sessions_held_messages"),
    why="reference flaw O2: a dead author's held messages wait for a restart")
add("settle.on_working", CONSUMER,
    'SETTLE_STATES = frozenset({"ready", "stopped"})', 'SETTLE_STATES = frozenset({"ready", "stopped", "working"})',
    t(DCORE, "test_working_state_is_not_a_settle_edge"),
    why="a 'working' state report fires held messages mid-turn")
add("hold.author_not_held", ROUTING,
    "        if author_session is not None:\n            self.hold(author_session, event.message_id)\n            return\n",
    "",
    t(DCORE, "test_live_agent_authors_post_is_held_then_fired_from_the_store_at_its_settle_edge"),
    why="a live agent's posts fan out mid-turn instead of at its settle edge")
add("mentions.no_case_folding", MENTIONS,
    "        seen.setdefault(match.group(1).casefold(), None)", "        seen.setdefault(match.group(1), None)",
    t(DMENT, "test_mention_grammar"),
    why="@Bob no longer reaches bob")
add("mentions.author_counts", MENTIONS,
    "    eligible = [m for m in members if m.id != author_id]", "    eligible = list(members)",
    t(DMENT, "test_resolution_counts_agent_members_only_never_the_author"),
    why="an agent's @everyone steers the agent itself")
add("deliver.no_dedupe_against_the_sweep", ROUTING,
    '        if message["seq"] <= session.floors.get(message["channel_id"], -1):\n            # Already swept',
    "        if False:\n            # Already swept",
    DCORE, DSWEEP,
    why="a post swept at start and then published live is delivered twice")
add("deliver.overtakes_the_sweep", ROUTING,
    "        if session.phase == PHASE_CURSOR:\n            # The session is catching up",
    "        if False:\n            # The session is catching up",
    DCORE, DSWEEP,
    why="a live deliver during a catch-up sweep overtakes the backlog (out of order)")
add("sweep.redelivers_acked", SWEEPS,
    '                    if seq not in cur.above and row["deleted_at_ms"] is None:',
    '                    if row["deleted_at_ms"] is None:',
    t(DCURS, "test_sweep_skips_self_authored_and_acked_messages"),
    why="an out-of-order ack above the mark is swept again at every start")
add("sweep.includes_own_posts", DSTORE,
    '"AND m.channel_seq > :after_seq AND m.author_account_id <> :agent_id "', '"AND m.channel_seq > :after_seq "',
    t(DCURS, "test_sweep_skips_self_authored_and_acked_messages"),
    why="an agent is swept its own messages")
add("seed.replays_history", CURSORS,
    "\"SELECT a.id, c.id, c.last_seq, '[]' FROM accounts a, channels c \"",
    "\"SELECT a.id, c.id, 0, '[]' FROM accounts a, channels c \"",
    t(DCURS, "test_seeds_home_on_creation_and_channels_on_subscribe_never_for_humans"),
    why="a new subscriber is swept the channel's whole history")
add("overrun.no_scan", CONSUMER,
    "        self.sweeper.sweep_all_live()\n        if self.scanner.allowed():\n            self.scan()",
    "        self.sweeper.sweep_all_live()",
    t(DREC, "test_lagged_overrun_leg_the_mention_in_the_dropped_window_is_owed"),
    why="a mention in the window an overrun dropped is never routed")
add("periodic.no_resweep_after_recovery", SCAN,
    "        if self.link.resweep_live or recovered:", "        if self.link.resweep_live:",
    t(DREC, "test_a_periodic_scan_that_finds_unseen_posts_pushes_them_to_live_subscribers"),
    why="posts the periodic scan recovered are never pushed to live subscribers")
add("flush.no_retry_one_by_one", UNIT,
    "            if len(ids) > 1:\n                self.link.failed(None, exc",
    "            if False:\n                self.link.failed(None, exc",
    t(DREC, "test_a_failed_flush_retries_each_message_alone"),
    why="one bad message keeps a whole batch unmarked until the next scan")
add("wake.not_coalesced", WAKERS,
    "            if last is not None and now - last < self.coalesce_ms:",
    "            if False:",
    t(DWAKE, "test_wakes_are_coalesced_per_agent_by_the_clock"),
    why="every message wakes the agent again")

# == backend-specific statements and the transient classification (store/engine.py) ===========
ENGINE = "src/tidings/store/engine.py"
add("pg.flush_reopens_acked", OWED_STORE,
    "AS t(a, m, c) ON CONFLICT (agent_id, message_id) DO NOTHING RETURNING 1), ",
    "AS t(a, m, c) ON CONFLICT (agent_id, message_id) DO UPDATE SET acked_at_ms = NULL RETURNING 1), ",
    t(DCURS, "test_an_ack_before_the_mention_pass_commits_is_never_undone"),
    backend="postgres",
    why="PostgreSQL's one-statement flush owes an acked mention again (its own statement, not SQLite's)")
add("transient.sqlite_busy_is_deterministic", ENGINE,
    "            return (code & 0xFF) in (5, 6)", "            return (code & 0xFF) in (6,)",
    t(WORKER, "test_fault_ingest_busy_fails_the_next_n_attempts"),
    why="SQLITE_BUSY classified as deterministic: a busy database quarantines frames")
add("transient.pg_serialization_is_deterministic", ENGINE,
    "    if isinstance(exc, (pgerr.SerializationFailure, pgerr.DeadlockDetected, pgerr.LockNotAvailable)):",
    "    if isinstance(exc, (pgerr.DeadlockDetected, pgerr.LockNotAvailable)):",
    t(WORKER, "test_fault_ingest_busy_fails_the_next_n_attempts"),
    backend="postgres",
    why="a PostgreSQL serialization failure classified as deterministic: the frame is quarantined")

# == the one failure path of delivery (D85) ====================================================
LINK = "src/tidings/delivery/link.py"
add("failure.no_resweep_request", LINK,
    "        if resweep:\n            self.resweep_live = True\n",
    "        if resweep:\n            pass\n",
    t(DREC, "test_a_failed_start_sweep_is_swept_again_at_the_next_periodic_scan"),
    why="a failed session edge is never swept again while the session lives")
# == issue 16: the pin sweep, ask answers, pins and asks over HTTP =============================
DPINS = "tests/delivery/test_pins_and_answers.py"
PINS_API = "tests/test_pins_asks_api.py"
PIN_SWEEP = "src/tidings/delivery/pins.py"
ANSWERS = "src/tidings/delivery/asks.py"
PINS_HUB = "src/tidings/hub/pins.py"
add("pins.no_pin_sweep", SWEEPS,
    "            if not self.pins.sweep_pins(session):",
    "            if False:",
    t(DPINS, "test_p1_a_pin_is_delivered_at_start_though_the_cursor_owes_nothing"),
    t(DPINS, "test_the_start_sweep_runs_cursors_then_pins_in_position_order_then_owed_mentions"),
    why="a session start never sends the channel's pins")
add("pins.sweep_before_cursor", CONSUMER,
    "        self.pins.begin(session)\n        self.sweeper.sweep(session)",
    "        self.pins.begin(session)\n        self.pins.sweep_pins(session)\n        self.sweeper.sweep(session)",
    t(DPINS, "test_the_start_sweep_runs_cursors_then_pins_in_position_order_then_owed_mentions"),
    why="the pins overtake the cursor backlog at start")
add("pins.owed_and_pinned_sent_twice", PIN_SWEEP,
    '    if pinned and outcome == OFFER_OK:\n        del pending[dispatch.message_id]',
    '    if False:\n        del pending[dispatch.message_id]',
    t(DPINS, "test_p3_stricter_a_message_both_owed_and_pinned_is_sent_once_with_both_flags"),
    why="a message the cursor sweep sent is sent again by the pin sweep (the reference's P3)")
add("pins.sixth_pin_allowed", PINS_HUB,
    "            if pins_store.count_pins(tx, cid) >= MAX_PINS:",
    "            if pins_store.count_pins(tx, cid) > MAX_PINS:",
    t(PINS_API, "test_pins_are_ordered_at_most_five_and_the_sixth_is_a_clear_409"),
    why="a channel takes a sixth pin")
add("pins.any_member_changes", PINS_HUB,
    "    if principal.is_admin or (principal.account_id is not None and principal.account_id == channel[\"owner_account_id\"]):",
    "    if principal.account_id is not None:",
    t(PINS_API, "test_members_read_pins_only_the_owner_and_the_admin_change_them"),
    why="any member may pin or unpin")
add("answers.not_owed_when_offline", ANSWERS,
    "            owed = asks_store.owed_answers(tx, session.agent_id, SWEEP_LIMIT)",
    "            owed = []",
    t(DPINS, "test_an_answer_to_an_offline_agent_is_owed_and_woken_then_sent_once_at_start"),
    t(DPINS, "test_an_answer_whose_dispatch_a_crash_lost_reaches_the_offline_agent_exactly_once"),
    why="an answer to an offline asker is never sent when it connects")
add("answers.scan_skips_undispatched", SCAN,
    "        self.scan_answers()\n", "",
    t(DPINS, "test_an_answer_whose_dispatch_a_crash_lost_reaches_the_offline_agent_exactly_once"),
    why="an answer whose dispatch a crash lost never wakes its offline asker")
add("mentions.reads_ask_questions", MENTIONS,
    '        if isinstance(block, dict) and block.get("kind") == "text":\n            text = block.get("text")',
    '        if isinstance(block, dict) and block.get("kind") in ("text", "ask"):\n'
    '            text = block.get("text") if block.get("kind") == "text" else " ".join(\n'
    '                q["text"] for q in block["ask"]["questions"])',
    t(DPINS, "test_the_mention_grammar_never_reads_ask_questions"),
    why="a question in an ask block mentions (steers or owes) the agents it names")
# == issue 15: mentions steer on every path (D54), references (D55), MCP refusals (D56), demo (D57)
CATCHUP = "tests/delivery/test_catch_up_mentions.py"
REFS_TESTS = "tests/test_api_refs.py"
add("catchup.mention_delivered_not_steered", "src/tidings/delivery/recipient.py",
    '    return Dispatch("steer" if mentioned else "deliver", public_message(row), row["channel_id"], mentioned)',
    '    return Dispatch("deliver", public_message(row), row["channel_id"], mentioned)',
    t(CATCHUP, "test_a_subscribed_offline_agents_missed_mention_comes_back_as_a_steer_in_cursor_order"),
    why="a subscribed agent's missed mention comes back as a plain deliver (issue 15's tour step 4)")
add("catchup.owed_steered_twice", SWEEPS,
    "            elif channel_id in acked and acked[channel_id] < seq <= session.floors.get(channel_id, -1):",
    "            elif False:",
    t(CATCHUP, "test_an_owed_mention_swept_by_the_cursors_is_steered_once"),
    why="one start sweep steers an owed mention twice (cursor sweep, then owed sweep)")
add("catchup.live_steer_overtakes_the_sweep", ROUTING,
    '            if session.phase == PHASE_CURSOR:\n                self.counters.incr("steer_deferred")',
    '            if False:\n                self.counters.incr("steer_deferred")',
    t(CATCHUP, "test_a_live_mention_while_the_session_catches_up_waits_for_the_sweep_in_order"),
    why="a live steer overtakes the catch-up and is then steered again by it")
add("catchup.swept_steer_pushed_again", ROUTING,
    '            if message["seq"] <= session.floors.get(message["channel_id"], -1):\n'
    '                self.counters.incr("steer_deduped")',
    '            if False:\n                self.counters.incr("steer_deduped")',
    t(CATCHUP, "test_a_mention_committed_before_the_sweep_read_it_is_steered_once"),
    why="a mention the start sweep already steered is pushed again live")
add("dispatch.mentions_you_constant", "src/tidings/delivery/sessions.py",
    '               "mentions_you": self.mentions_you}', '               "mentions_you": True}',
    t(CATCHUP, "test_live_dispatches_carry_mentions_you"),
    why="every dispatch claims to mention its recipient")
add("refs.names_not_resolved", "src/tidings/hub/refs.py",
    "    return seen[0]\n", "    return ref\n",
    t(REFS_TESTS, "test_handles_and_names_work_wherever_ids_do"),
    why="#name and bare names in paths are 404s again")
add("refs.not_a_member_is_404", "src/tidings/hub/posting.py",
    "            if channels_store.owns_an_agent_member(tx, channel_id, author_id):",
    "            if False:",
    t(REFS_TESTS, "test_not_a_member_is_403_when_you_can_see_the_channel_and_404_when_you_cannot"),
    why="posting where you can see but are not a member says 'unknown channel'")
add("mcp.refusal_not_jsonrpc", "src/tidings/mcp/http.py",
    "            response = await refusal(request, exc)",
    "            response = error_response(exc.status, exc.code, exc.message)",
    t("tests/mcp/test_mcp_http.py", "test_the_sdk_client_shows_why_its_token_was_refused"),
    why="the MCP SDK client shows 'Server returned an error response' instead of the reason")
add("demo.duplicates_the_sample", "src/tidings/ingest/demo.py",
    '_data(t[0], "Anyone up for a hike on Saturday?")', '_data(t[0], "Who\'s cooking tonight?")',
    t("tests/test_links.py", "test_the_demo_then_the_sample_capture_show_each_message_once_and_one_name_per_identity"),
    why="the demo seeds a message the sample capture brings again")
# == two-way bridges (issue 13): outbox, echo suppression ======================================
OUTBOX_SRC = "src/tidings/bridges/outbox.py"
OUTBOX_STORE = "src/tidings/store/outbox.py"
ECHO_SRC = "src/tidings/bridges/echo.py"
BOUT = "tests/bridges/test_outbox.py"
BECHO = "tests/bridges/test_echo.py"
add("outbox.link_post_goes_back_out", OUTBOX_SRC,
    "        if author_id == bridge_account:\n            continue",
    "        if False:\n            continue",
    t(BOUT, "test_a_person_post_in_a_linked_channel_queues_one_send_and_an_inbound_post_queues_none"),
    why="the link's own inbound post is sent back to the network it came from")
add("outbox.agent_not_held", OUTBOX_SRC,
    "await_settle=kind == \"agent\"", "await_settle=False",
    t(BOUT, "test_a_held_agent_reply_is_pulled_only_after_its_turn_settles"),
    why="a held mid-turn agent reply reaches the network before its turn settles")
add("outbox.retry_after_ignored", OUTBOX_SRC,
    "delay = retry_after if retry_after is not None else backoff_ms(int(row[\"attempts\"]))",
    "delay = backoff_ms(int(row[\"attempts\"]))",
    t(BOUT, "test_a_retryable_failure_waits_its_retry_after_and_a_permanent_one_keeps_its_cause"),
    why="a rate-limited send is retried before the network's retry-after")
add("outbox.retries_forever", OUTBOX_SRC,
    "elif retryable and int(row[\"attempts\"]) + 1 < MAX_ATTEMPTS:", "elif retryable:",
    t(BOUT, "test_retryable_failures_end_failed_after_the_attempt_limit"),
    why="an item that always fails retryably stays pending forever")
add("outbox.pending_ignores_not_before", OUTBOX_STORE,
    "AND o.not_before_ms <= :now AND", "AND",
    t(BOUT, "test_a_retryable_failure_waits_its_retry_after_and_a_permanent_one_keeps_its_cause"),
    why="a backed-off item is handed out again at once")
add("echo.incoming_not_claimed", ECHO_SRC,
    "    tx.execute(_MAKE_OUTGOING, {\"id\": message_id})\n    return True",
    "    tx.execute(_MAKE_OUTGOING, {\"id\": message_id})\n    return False",
    t(BECHO, "test_signal_data_message_with_our_timestamp_is_ours_without_an_account"),
    why="our own message handed back as a dataMessage is posted into the channel a second time")
# == search, network time, attachments (issue 15 part B; D58-D61) ==================================
SEARCH_HUB = "src/tidings/hub/search.py"
SEARCH_STORE = "src/tidings/store/search.py"
SEARCH_PROP = "tests/search/test_search_property.py"
SEARCH_API = "tests/search/test_search.py"
ATT = "tests/test_attachments.py"
add("search.every_channel_readable", SEARCH_HUB,
    "account_id=who.account_id, all_channels=who.is_admin,",
    "account_id=who.account_id, all_channels=True,",
    t(SEARCH_PROP, "test_search_returns_exactly_the_readable_matching_messages"),
    why="search shows messages of channels the caller is not a member of")
add("search.every_bridge_readable", SEARCH_HUB,
    "owner_id=owner, all_bridges=owner is None,",
    "owner_id=owner, all_bridges=True,",
    t(SEARCH_PROP, "test_search_returns_exactly_the_readable_matching_messages"),
    why="search shows bridged chats of other owners")
add("search.deleted_hub_messages_found", SEARCH_STORE,
    '    "m.deleted_at_ms IS NULL "\n',
    '    "1 = 1 "\n',
    t(SEARCH_API, "test_the_index_follows_edits_and_deletes"),
    why="a deleted channel message is still found")
add("network_time.not_passed_on", "src/tidings/bridges/links.py",
    "                    occurred_at_ms=change.occurred_at_ms,\n",
    "",
    t("tests/test_network_time.py", "test_a_linked_message_keeps_its_network_time_and_the_channel_keeps_hub_order"),
    why="a linked message shows when the hub got it, not when it was sent")
add("attachments.not_projected", "src/tidings/ingest/projection.py",
    "                if ev.attachments:  # metadata, with the message only (D61)",
    "                if False:",
    t(ATT, "test_metadata_from_all_three_codecs_is_kept_and_shown"),
    why="attachment metadata is dropped after decoding")
add("attachments.hash_unchecked", "src/tidings/blobs.py",
    "        if self.hasher.hexdigest() != self.sha256:",
    "        if False:",
    t(ATT, "test_upload_limits_and_checks"),
    why="bytes are stored under a name that is not their hash")
add("attachments.anyone_uploads", "src/tidings/hub/attachments.py",
    '    if who.scope != "bridge" or who.bridge_id != bridge_id:',
    '    if who.scope != "bridge":',
    t(ATT, "test_upload_limits_and_checks"),
    why="a bridge uploads bytes for another bridge's attachments")
# == issue 12: round trips (deferred statements, read/send ahead, the claim, batching) ========
RT = "tests/test_round_trips.py"
BATCH_EQ = "tests/ingest/test_batch_equivalence.py"
INGEST_INBOX_SRC = "src/tidings/ingest/inbox.py"
add("batch.pg_savepoint_rollback_dropped", ENGINE,
    '                self._send(f"ROLLBACK TO SAVEPOINT {name}", None).close()\n',
    "                pass\n",
    t(RT, "test_a_failing_savepoint_takes_back_only_its_own_work_and_what_waited_inside_it"),
    backend="postgres",
    why="a failed frame's savepoint (sent with its first statement) is never rolled back: the batch's "
        "transaction stays aborted and every later frame of it is lost")
add("batch.group_savepoint_dropped", "src/tidings/ingest/apply.py",
    "    if batch is None:\n        return tx.savepoint(), True\n",
    "    if batch is None:\n        return tx.callbacks(), True\n",  # (a unit with no savepoint)
    t(WORKER, "test_a_failed_frame_leaves_its_claim_rolled_back_and_is_quarantined_once"),
    k="group8",
    why="a grouped drain applies a frame without its own savepoint: a failed frame's rows and claim stay")
DRAIN_GROUP = "tests/ingest/test_drain_group.py"
add("group.rest_not_released", "src/tidings/ingest/grouping.py",
    "                        inbox_store.release_claimed(tx, [i for i in left if i in rows])\n",
    "",
    t(DRAIN_GROUP, "test_a_transient_error_in_a_frames_savepoint_ends_the_group_there"),
    backend="both",
    why="a transient error in a group leaves the frames after it claimed: they are marked applied, never projected (D118)")
add("group.final_flush_dropped", "src/tidings/ingest/grouping.py",
    "            for batch in batches.values():\n                batch.flush()\n    except",
    "    except",
    t(DRAIN_GROUP, "test_a_group_of_two_bridges_commits_once_with_its_quarantined_frame"),
    why="a drain group commits its frames as applied without writing their batch's rows (D118)")
add("group.lost_group_not_replayed", "src/tidings/ingest/grouping.py",
    "        return [(inbox_id, process_one(inbox_id, 1 if inbox_id == first else 0)) for inbox_id in ids]",
    "        return [(inbox_id, process_one(inbox_id, 1 if inbox_id == first else 0)) for inbox_id in ids[1:]]",
    t(DRAIN_GROUP, "test_a_transient_error_outside_any_savepoint_runs_every_frame_of_the_group_alone"),
    why="a group lost to a transient error replays all but its first frame, which waits for the next drain (D118)")
add("group.one_lock_for_all", "src/tidings/ingest/apply.py",
    "        for bridge_id in sorted({row[0] for row in rows.values()}):\n",
    "        for bridge_id in sorted({row[0] for row in rows.values()})[:1]:\n",
    t(DRAIN_GROUP, "test_a_group_locks_each_of_its_bridges_before_it_reads_their_rows"),
    backend="postgres",
    why="a drain group locks only its first bridge: another bridge's rows are written without "
        "its lock (D117/D118)")
add("batch.claim_guard_moved", INBOX_SRC,
    "    \"WHERE inbox_id = :inbox_id AND processed_at_ms IS NULL \"\n    \"RETURNING bridge_id",
    "    \"WHERE inbox_id = :inbox_id \"\n    \"RETURNING bridge_id",
    t(WORKER, "test_a_frame_finished_after_it_was_listed_is_gone_not_applied_again"),
    why="the claim (load + applied mark) lost its at-most-once guard: a frame finished elsewhere is applied again")
# batch.ensure_guard_moved (PostgreSQL's roster ensure sent ahead) went with D115: see "guard.sql.*"
# at the end, and roster.every_sender_joins for where the ensure is guarded now.
add("batch.group_out_of_receipt_order", WORKER_SRC,
    "                    if len(batch) >= self.group_size:\n                        self._run_group(batch, stats, on_frame)",
    "                    if len(batch) >= self.group_size:\n"
    "                        self._run_group(batch[::-1], stats, on_frame)",
    t(WORKER, "test_drain_applies_a_paged_backlog_in_receipt_order_once_each"),
    k="group8",
    why="a drain group is applied out of receipt order")
add("batch.request_out_of_receipt_order", INGEST_INBOX_SRC,
    "    for frame in frames:\n        inbox_id = mint(now_ms)",
    "    for frame in frames[::-1]:\n        inbox_id = mint(now_ms)",
    t(BATCH_EQ, "test_a_corpus_applied_in_batches_of_any_size_leaves_the_store_it_leaves_one_frame_at_a_time"),
    why="a batch request's frames are stored and applied last first: the store differs from one frame a request")
add("batch.speculative_order_check_ignored", ON_APPEND,
    "                if held_up is not None and held_up():\n                    raise _HeldUp()\n",
    "                if held_up is not None:\n                    held_up()\n",
    t(APPEND, "test_new_frames_wait_behind_an_older_unprocessed_frame_of_their_bridge"),
    backend="postgres",
    why="PostgreSQL's speculative apply on append reads the order check but keeps the frame applied: "
        "a new frame applies before an older unprocessed one of its bridge")

# == issue 12: group commit (D97) and the echo lock (D98) ======================================
GROUP_SRC = "src/tidings/ingest/group_commit.py"
GROUP = "tests/ingest/test_group_commit.py"
add("group.member_savepoint_dropped", GROUP_SRC,
    "                        with tx.savepoint():\n                            member.value = member.work(tx)",
    "                        if True:\n                            member.value = member.work(tx)",
    t(GROUP, "test_a_member_that_raises_leaves_nothing_behind_and_gets_its_own_error"),
    backend="both",
    why="a shared transaction runs a member without its own savepoint: a member that raises leaves its "
        "writes behind in the others' commit")
add("group.lost_transaction_unnoticed", GROUP_SRC,
    "                    if not tx.active():\n",
    "                    if False:\n",
    t(GROUP, "test_a_member_that_fails_inside_a_shared_transaction_runs_again_alone"),
    backend="both",
    why="a member ended the shared transaction under the group: later members autocommit piecemeal and "
        "are applied twice")
add("group.out_of_arrival_order", GROUP_SRC,
    "                    batch = self._queue[: self.max_members]\n",
    "                    batch = self._queue[: self.max_members][::-1]\n",
    t(GROUP, "test_appends_of_one_bridge_in_one_group_are_applied_in_the_order_they_arrived"),
    backend="both",
    why="a shared transaction runs its members last first: one bridge's appends apply out of receipt order")
add("echo.lock_after_read", "src/tidings/bridges/echo.py",
    "            _serialize(self.tx, conversation_id)  # the locks go first, in the same round trip\n",
    "            pass\n",
    t("tests/ingest/test_fast_path.py",
      "test_an_outgoing_message_takes_the_echo_lock_in_the_round_trip_of_its_echo_read"),
    backend="postgres",
    why="the echo read runs without its per-conversation lock: an echo and its send report can miss each other")

# == issue 12: a cluster node's one-statement post sends its notification (D99) ================
add("posting.alone_notify_not_sent", MESSAGES,
    '"SELECT inserted.seq, inserted.channel_seq FROM inserted CROSS JOIN notified"',
    '"SELECT inserted.seq, inserted.channel_seq FROM inserted"',
    t("tests/test_post_notify.py", "test_a_post_its_checking_statement_did_not_take_still_notifies_from_the_insert"),
    backend="postgres",
    why="the notification's CTE is never referenced, so PostgreSQL never runs it: a cluster node's post "
        "reaches no other node until a recovery scan")
add("postgate.notify_not_sent", MESSAGES,
    '"SELECT inserted.seq, inserted.channel_seq, inserted.topic_id FROM inserted CROSS JOIN notified"',
    '"SELECT inserted.seq, inserted.channel_seq, inserted.topic_id FROM inserted"',
    t("tests/test_post_notify.py",
      "test_a_one_statement_post_sends_the_posted_notification_it_would_send_from_a_transaction"),
    backend="postgres",
    why="the checking statement's notification CTE is never referenced, so PostgreSQL never runs it: a "
        "cluster node's post reaches no other node until a recovery scan")
# == SQLite search index catch-up (issue 12; D95) ===================================================
SEARCH_INDEX_SRC = "src/tidings/store/search_index.py"
SEARCH_INDEX = "tests/search/test_search_index.py"
add("search_index.search_does_not_catch_up", SEARCH_INDEX_SRC,
    "        catch_up_all(store)\n    with store.read() as tx:",
    "        pass\n    with store.read() as tx:",
    t(SEARCH_INDEX, "test_a_write_only_queues_and_a_search_indexes_what_is_pending_first"),
    why="a search runs before the queued messages are indexed: a committed message is not found")
add("search_index.every_old_text_removed", SEARCH_INDEX_SRC,
    '"WHERE nth = 1 AND old_text IS NOT NULL"',
    '"WHERE old_text IS NOT NULL"',
    t(SEARCH_INDEX, "test_edits_and_deletes_queued_together_reach_the_index_exactly"),
    why="a row edited twice before a catch-up has text removed that the index never held: the index is corrupt")
add("search_index.batch_splits_a_row", SEARCH_INDEX_SRC,
    'consume=Stmt(f"DELETE FROM {t.queue} WHERE rid IN ({taken})"',
    'consume=Stmt(f"DELETE FROM {t.queue} WHERE id <= :upto"',
    t(SEARCH_INDEX, "test_edits_and_deletes_queued_together_reach_the_index_exactly"),
    why="a batch consumes only part of a row's changes: the next batch removes text the index no longer holds")
add("search_index.pass_not_woken", SEARCH_INDEX_SRC,
    "        tx.after_commit(SIGNAL.bump)",
    "        pass",
    t(SEARCH_INDEX, "test_the_background_pass_indexes_without_a_search"),
    why="a commit that queued text does not wake the background pass: the index lags until the idle pass")
add("search_index.queue_not_consumed", SEARCH_INDEX_SRC,
    'consume=Stmt(f"DELETE FROM {t.queue} WHERE rid IN ({taken})"',
    'consume=Stmt(f"DELETE FROM {t.queue} WHERE 0 AND rid IN ({taken})"',
    t(SEARCH_INDEX, "test_a_crash_between_the_write_and_the_indexing_loses_nothing"),
    why="indexed changes stay queued: every later catch-up indexes the same text again")
# == the store's PostgreSQL wire (D101) ==============================================================
PG_WIRE_SRC = "src/tidings/store/pg_wire.py"
PG_WIRE = "tests/test_pg_wire.py"
add("pg_wire.skipped_prepare_kept", PG_WIRE_SRC,
    "                        prepared.pop(introduced, None)  # not prepared after all",
    "                        pass",
    t(PG_WIRE, "test_a_prepare_the_server_skipped_is_forgotten_and_sent_again"),
    backend="postgres",
    why="a prepare the server skipped stays cached: every later run of that statement on the connection "
        "names a prepared statement that does not exist")
add("pg_wire.psycopg_prepares_too", "src/tidings/store/engine.py",
    "    dbapi.prepare_threshold = None",
    "    pass",
    t(PG_WIRE, "test_statements_prepared_by_the_wire_outlive_a_rollback_sent_through_psycopg"),
    backend="postgres",
    why="psycopg prepares its own statements on the store's connections, then deallocates every prepared "
        "statement after a ROLLBACK it sees: the store's next statement fails")
# Replaces projection.roster_identities_not_read_ahead: reads are no longer announced one by
# one (D115); ``want_rows`` asks the batch for every key, and a key it leaves out is read when
# first used, one round trip each.
add("projection.roster_identities_not_wanted", PROJ_SRC,
    "            for part in ev.participants:\n                identity(part.identity)\n",
    "",
    t("tests/ingest/test_fast_path.py", "test_the_eager_drain_reads_a_frames_rows_in_one_round_trip"),
    t("tests/ingest/test_fast_path.py",
      "test_a_roster_snapshot_reads_its_participants_in_the_round_trip_of_its_conversation_read"),
    backend="postgres",
    why="a roster snapshot reads each participant's identity in a round trip of its own: "
        "a Google or group snapshot of N people costs N more round trips")
# Replaces reactions.fence_and_reactions_apart: the fence and the reactions of a message are now
# two reads of the batch's one read; here the fences are read only when no reactions are.
add("reactions.fence_read_apart", REACT,
    "        fences = self.fences.take_wanted()\n",
    "        fences = [] if ids else self.fences.take_wanted()\n",
    t("tests/ingest/test_fast_path.py", "test_the_eager_drain_reads_a_frames_rows_in_one_round_trip"),
    t("tests/ingest/test_fast_path.py", "test_a_reaction_snapshot_reads_its_fence_and_its_reactions_in_one_round_trip"),
    backend="postgres",
    why="a reaction snapshot of a stored message reads its fence and its reactions in two round trips")
add("engine.withdrawn_read_ahead_kept", "src/tidings/store/engine.py",
    "            self._ahead.pop(_ahead_key(stmt, params), None)\n\n    def send_ahead",
    "            pass\n\n    def send_ahead",
    t(ROUND_TRIPS, "test_a_withdrawn_read_ahead_never_answers_a_later_read_after_a_write"),
    backend="postgres",
    why="a read-ahead a stale reaction snapshot never read answers a later frame's read of the same "
        "reactions after they were written: the snapshot diff runs on old rows")
# == writes sent behind, reads announced with the inbox insert (D105) =================================
FAST_PATH = "tests/ingest/test_fast_path.py"
add("engine.released_savepoint_drops_writes_behind", ENGINE,
    "            if not self._drop_unsent(entry, keep_writes=True):",
    "            if not self._drop_unsent(entry):",
    t(ROUND_TRIPS, "test_a_savepoint_that_sent_nothing_keeps_the_writes_it_sent_behind"),
    backend="postgres",
    why="a savepoint inside which nothing was sent is released for free, and the writes it sent behind "
        "go with it: a frame's projection is silently lost")
add("engine.announced_read_outlives_its_savepoint", ENGINE,
    "            if self._ahead:\n                # A read announced inside",
    "            if False:\n                # A read announced inside",
    t(ROUND_TRIPS, "test_a_read_announced_inside_a_savepoint_and_never_read_is_forgotten_when_it_ends"),
    backend="postgres",
    why="a read a frame announced but never made answers a later frame's read of the same row, after "
        "writes it predates")
add("engine.write_behind_failure_raised_as_is", ENGINE,
    "            if isinstance(owner, _Later) and (not self._open",
    "            if False and isinstance(owner, _Later) and (not self._open",
    t(ROUND_TRIPS, "test_a_write_sent_behind_that_fails_at_commit_loses_the_transaction"),
    t(FAST_PATH, "test_a_frame_whose_write_behind_fails_at_commit_is_stored_for_the_drain_which_quarantines_it"),
    backend="postgres",
    why="a write that failed outside its frame's savepoint is raised as an ordinary error: the request "
        "fails instead of being appended again for the drain")
add("engine.commit_drops_writes_behind", ENGINE,
    "        if not any(isinstance(entry[2], _Later) for entry in pending):",
    "        if True:",
    t(ROUND_TRIPS, "test_a_write_sent_behind_goes_out_with_the_commit_in_one_round_trip"),
    backend="postgres",
    why="the COMMIT drops what waits behind: the last frame's writes are never sent")
add("ingest.write_behind_failure_not_appended_again", "src/tidings/ingest/engine.py",
    "except (_ApplyBroke, WriteBehindFailed) as exc:",
    "except _ApplyBroke as exc:",
    t(FAST_PATH, "test_a_frame_whose_write_behind_fails_at_commit_is_stored_for_the_drain_which_quarantines_it"),
    backend="postgres",
    why="a frame whose write failed at COMMIT fails its request: the bridge retries it forever instead "
        "of the drain quarantining it")
add("projection.ensure_touches_always", CONVS,
    "        if self.member(conversation_id, identity_id) is not None:\n            return 0\n",
    "        if self.member(conversation_id, identity_id) is not None:\n"
    "            self.conversations.touch(conversation_id, now)\n            return 0\n",
    t(BATCH, "test_a_known_members_message_moves_recency_but_never_touches_its_conversation"),
    why="the roster ensure touches the conversation though nobody joined (a message that also moves "
        "recency then writes the touch with it)")
# Replaces projection.reads_announced_before_the_frame_writes_them: nothing is announced per
# frame any more (D115); the batch's rows are what a frame sees, and here a reaction's target is
# looked up as the database had it when the batch read it, not as the frame left it.
add("projection.reaction_target_looked_up_as_read", BMSG,
    "    def exists(self, message_id: str) -> bool:\n        return self.get(message_id) is not None\n",
    "    def exists(self, message_id: str) -> bool:\n        self.get(message_id)\n"
    "        return self.table.read.get(message_id) is not None\n",
    t("tests/ingest/test_projection.py", "test_a_frame_that_carries_a_message_and_reactions_to_it_applies_them_all"),
    # (the demo's request reacts to a message of an earlier frame; World's hook flushes mid-frame)
    t("tests/ingest/test_api_bridges.py", "test_demo_seeds_alices_signal_bridge_and_its_frames_apply"),
    why="a delta reaction's target is looked up as the batch read it, before the frame's own insert of "
        "that message: the reaction is counted orphaned and dropped")
add("ingest.writes_not_behind_on_append", "src/tidings/ingest/engine.py",
    '        tx.write_behind = self.write_behind and tx.dialect == "postgresql"',
    "        tx.write_behind = False",
    t(FAST_PATH, "test_one_applied_frame_costs_these_statements_and_a_known_bridge_is_not_read_again"),
    t(FAST_PATH, "test_a_batch_of_frames_costs_two_round_trips_whatever_its_size"),
    backend="postgres",
    why="apply on append sends every write at once: a Signal frame is 4 round trips again, not 2")
# Replaces projection.roster_not_announced (reads announced with the inbox insert, gone with
# D115): ``want_rows`` leaves out a snapshot's roster, which is then read when first used.
add("projection.roster_not_wanted", PROJ_SRC,
    "            batch.rosters.want_roster(conversation_id_for(bridge_id, ev.remote_conversation_id))\n",
    "",
    t(FAST_PATH, "test_a_roster_snapshot_reads_its_participants_in_the_round_trip_of_its_conversation_read"),
    backend="postgres",
    why="apply on append reads a roster snapshot's roster in a round trip of its own, after the batch's read")
# Replaces projection.snapshot_reads_not_announced: ``want_rows`` leaves out the reactions and
# fence of a snapshot message, which are then read when first used.
add("projection.snapshot_reactions_not_wanted", PROJ_SRC,
    "            if ev.reactions_snapshot and platform in SNAPSHOT_PLATFORMS:\n                batch.reactions.want(mid)\n",
    "",
    t(FAST_PATH, "test_a_reaction_snapshot_reads_its_fence_and_its_reactions_in_one_round_trip"),
    backend="postgres",
    why="apply on append reads a snapshot message's fence and reactions in a round trip of their own")
add("engine.commit_sends_waiting_savepoints", ENGINE,
    "        self._pending = [entry for entry in pending if not entry[0].startswith(_SAVEPOINT_WORDS)]\n",
    "        self._pending = list(pending)\n",
    t(FAST_PATH, "test_one_applied_frame_costs_these_statements_and_a_known_bridge_is_not_read_again"),
    # (D115: only a frame that may call the link hook takes a savepoint now)
    t(BATCH, "test_a_frame_that_may_call_the_hook_leaves_its_savepoints_release_to_the_commit"),
    backend="postgres",
    why="the RELEASE of every frame goes out with the COMMIT that releases it anyway: a statement a frame")
# Replaces echo.lock_taken_twice (the lock announced, then taken again): the batch's echo read
# (``Claims.reads``) takes each conversation's lock; here it is taken after that read.
add("echo.lock_taken_after_the_read", ECHO_SRC,
    "        for conversation_id in sorted({cid for cid, _ in keys}):\n"
    "            _serialize(self.tx, conversation_id)  # the locks go first, in the same round trip\n"
    "\n"
    "        def take(rows: list[tuple[Any, ...]]) -> None:\n",
    "        def take(rows: list[tuple[Any, ...]]) -> None:\n"
    "            for conversation_id in sorted({cid for cid, _ in keys}):\n"
    "                _serialize(self.tx, conversation_id)\n",
    t(BATCH, "test_an_outgoing_message_takes_its_echo_lock_before_its_echo_read"),
    backend="postgres",
    why="the echo read runs before its per-conversation lock is taken: an echo and its send report can "
        "still miss each other")
# bridge_message.upsert_rows_update_sees_no_guard (PostgreSQL's one-statement message upsert) went
# with D115: see guard.sql.bridge_messages at the end.
WORKER = "src/tidings/ingest/worker.py"
add("drain.writes_not_behind", WORKER,
    '                    tx.write_behind = self.write_behind and tx.dialect == "postgresql"',
    "                    tx.write_behind = False",
    t(FAST_PATH, "test_the_drain_sends_a_frames_writes_behind_and_its_reads_ahead"),
    backend="postgres",
    why="the drain sends every write of a frame at once: a drained Signal message is 9 round trips, not 4")
# Replaces drain.reads_not_announced (the drain decoding ahead to announce a frame's reads): a
# drained frame is a batch of its own, whose rows ``want_rows`` asks for; here it asks for none.
add("drain.rows_not_wanted", PROJ_SRC,
    "    want_rows(batch, events)\n    batch.read()\n",
    "    batch.read()\n",
    t(FAST_PATH, "test_the_drain_sends_a_frames_writes_behind_and_its_reads_ahead"),
    t(FAST_PATH, "test_the_eager_drain_reads_a_frames_rows_in_one_round_trip"),
    backend="postgres",
    why="a drained frame's reads go out one round trip each instead of together after its claim")
add("drain.write_behind_failure_not_unwrapped", WORKER,
    "                raise failed.__cause__ or failed from None",
    "                raise",
    t(FAST_PATH, "test_a_drained_frame_whose_write_behind_fails_is_quarantined_alone_with_the_databases_cause"),
    t(FAST_PATH, "test_a_drained_frame_whose_write_behind_fails_transiently_is_tried_again_not_quarantined"),
    backend="postgres",
    why="a drained frame's write that fails at COMMIT is judged by the wrapper, not the database's error: "
        "a serialization failure quarantines the frame instead of retrying it, and causes read "
        "'internal error'")
add("drain.listing_in_a_transaction", WORKER,
    "            with conn.autocommit_read() as tx:\n                return inbox_store.unprocessed_after(",
    "            with conn.read() as tx:\n                return inbox_store.unprocessed_after(",
    t(FAST_PATH, "test_the_drain_sends_a_frames_writes_behind_and_its_reads_ahead"),
    backend="postgres",
    why="the drain's page listing pays a BEGIN and a ROLLBACK round trip for one statement")
LINKS_SRC = "src/tidings/bridges/links.py"
LINKS_TESTS = "tests/test_links.py"
add("links.hook_acts_on_every_conversation", BATCH_SRC,
    '        acts_on = getattr(hook, "acts_on", None)\n        if acts_on is None:\n            return True\n',
    "        acts_on = None\n        if acts_on is None:\n            return True\n",
    t(LINKS_TESTS, "test_a_hub_with_links_applies_an_unlinked_conversations_message_in_two_round_trips"),
    backend="postgres",
    why="a hub with bridge links writes every incoming message eagerly: 4 round trips a frame, not 2")
add("links.hook_read_not_announced", BATCH_SRC,
    "                for cid in fresh:\n                    announce(tx, cid)\n",
    "                pass\n",
    t(LINKS_TESTS, "test_a_hub_with_links_applies_an_unlinked_conversations_message_in_two_round_trips"),
    backend="postgres",
    why="the link hook's read of a conversation's links (asked for by ``want_rows``, announced with the "
        "batch's reads) costs a round trip of its own")
add("links.hook_acts_on_no_conversation", LINKS_SRC,
    "        return bool(links_store.linked_channels(tx, conversation_id))",
    "        return False",
    LINKS_TESTS,
    backend="postgres",
    why="a linked conversation's messages are written behind and never posted to their channels")

# == the consumer's roster copy (D108) ==========================================================
ROSTER_SRC = "src/tidings/store/roster.py"
ROSTER_TESTS = "tests/delivery/test_roster_cache.py"
add("rostercopy.epoch_ignored", ROSTER_SRC,
    "        if read_epoch is None or read_epoch != self.epoch:\n",
    "        if self.epoch is None:\n",
    ROSTER_TESTS, backend="both",
    why="a roster kept across an epoch change: a new subscriber gets nothing, a removed one keeps getting "
        "messages, a renamed agent's mention is lost")
add("rostercopy.member_trigger_dropped", "src/tidings/store/migrations/sqlite/0014_roster_epoch.sql",
    "CREATE TRIGGER channel_members_roster_update AFTER UPDATE OF channel_id, account_id, subscribed ON channel_members\n"
    "BEGIN\n    UPDATE roster_epoch SET epoch = epoch + 1 WHERE id = 1;\nEND;\n",
    "",
    ROSTER_TESTS,
    why="a subscription change leaves the epoch alone, so the consumer's copy misses it")
add("rostercopy.handle_not_a_roster_input", "src/tidings/store/migrations/postgresql/0015_roster_epoch_at_commit.sql",
    "    AFTER UPDATE OF kind, handle, wake_json, home_channel_id ON accounts\n",
    "    AFTER UPDATE OF kind, wake_json, home_channel_id ON accounts\n",
    ROSTER_TESTS, backend="postgres",
    why="a renamed agent keeps its old handle in the consumer's copy: a mention of the new one is lost")
add("rostercopy.epoch_locked_at_the_write", "src/tidings/store/migrations/postgresql/0015_roster_epoch_at_commit.sql",
    "    AFTER INSERT OR DELETE OR UPDATE OF channel_id, account_id, subscribed ON channel_members\n"
    "    DEFERRABLE INITIALLY DEFERRED\n",
    "    AFTER INSERT OR DELETE OR UPDATE OF channel_id, account_id, subscribed ON channel_members\n"
    "    DEFERRABLE INITIALLY IMMEDIATE\n",
    t(ROSTER_TESTS, "test_an_open_roster_write_holds_up_no_other_roster_write"), backend="postgres",
    why="the epoch row is locked from a membership write until its commit: an open transaction holds up "
        "every other roster write on the database")
add("rostercopy.bumped_per_row", "src/tidings/store/migrations/postgresql/0015_roster_epoch_at_commit.sql",
    "     WHERE id = 1 AND bumped_by IS DISTINCT FROM pg_current_xact_id();\n",
    "     WHERE id = 1;\n",
    t(ROSTER_TESTS, "test_an_open_roster_write_holds_up_no_other_roster_write"), backend="postgres",
    why="a transaction moves the epoch once per changed row, not once: the row is updated again and again "
        "at every commit that changed many memberships")
add("rostercopy.cached_channels_read_again", "src/tidings/store/delivery.py",
    "        cached = roster.cached(wanted)\n",
    "        cached: set[str] = set()\n",
    t(ROSTER_TESTS, "test_an_unchanged_roster_is_served_from_the_copy"), backend="both",
    why="the copy is never used: every batch reads its rosters again")
add("rostercopy.stale_channels_not_read_again", "src/tidings/store/delivery.py",
    '+ CHANNELS_AGENTS_SELECT.replace("{IN}", "{CACHED}") + f" AND {_EPOCH_MOVED}"',
    '+ CHANNELS_AGENTS_SELECT.replace("{IN}", "{CACHED}") + " AND 1 = 0"',
    ROSTER_TESTS, backend="both",
    why="at a new epoch the channels the copy held are not read again: their fan-out finds no agent")
add("rostercopy.held_rosters_served_at_any_epoch", "src/tidings/store/delivery.py",
    "    if read_epoch is None or read_epoch != roster.epoch:\n        return None\n",
    "    if read_epoch is None:\n        return None\n",
    ROSTER_TESTS, backend="both",
    why="D126: with every roster held, the light read serves the copy whatever epoch it read: a "
        "subscription change is missed until a new channel is fanned out to")
add("rostercopy.held_read_never_used", "src/tidings/store/delivery.py",
    "        if not uncached:\n            held = _rows_at_held_epoch(",
    "        if False:\n            held = _rows_at_held_epoch(",
    t(ROSTER_TESTS, "test_a_batch_whose_rosters_are_all_held_reads_only_its_rows_and_the_epoch"), backend="both",
    why="D126: a batch whose rosters are all held still runs the statement with the join branches, "
        "about 0.2 ms more of PostgreSQL's time a read")

# -- a request's rows in one statement (D113, PostgreSQL) -------------------------------------
REQUEST_ROWS = "tests/ingest/test_request_rows.py"
REQUEST_ROWS_ONE = t(REQUEST_ROWS, "test_a_request_of_several_frames_answers_and_stores_what_one_row_inserts_do")
# Replaces requestrows.one_row_inserts_again (the one-row insert of PostgreSQL's single frames is
# gone: every applying append keeps its rows, D115): the rows kept so far go out before each frame.
add("requestrows.rows_sent_a_frame_at_a_time", ON_APPEND,
    "        if rows.full():\n            rows.send(tx)  # between two frames",
    "        if True:\n            rows.send(tx)  # between two frames",
    REQUEST_ROWS_ONE, t(FAST_PATH, "test_a_batch_of_frames_costs_two_round_trips_whatever_its_size"),
    backend="both",
    why="a request of several frames inserts a row a frame again: a statement a frame more on the server")
add("requestrows.keys_of_the_request_not_kept", ON_APPEND,
    '            cast("dict[str, tuple[Any, ...]]", self._stored)[frame.dedupe_key] = (\n',
    '            {}[frame.dedupe_key] = (\n',
    REQUEST_ROWS_ONE, backend="postgres",
    why="a key repeated inside the request is inserted twice: the request loses its transaction to the "
        "unique index and is appended again without apply on append")
add("requestrows.stored_keys_not_read", ON_APPEND,
    '            self._stored = inbox_store.stored_by_dedupe_keys(tx, self.bridge_id, cast("list[str]", self._keys))\n',
    "            self._stored = {}\n",
    REQUEST_ROWS_ONE, backend="postgres",
    why="a replay of a stored frame is inserted again: the request loses its transaction to the unique index")
add("requestrows.cause_dropped", ON_APPEND,
    '"outcome": outcome, "cause": cause,',
    '"outcome": outcome, "cause": None,',
    REQUEST_ROWS_ONE, backend="postgres",
    why="a quarantined frame's row loses its cause")
add("requestrows.rows_never_sent", ON_APPEND,
    "        cast(RequestRows, self.rows).send(tx)\n",
    "        pass\n",
    REQUEST_ROWS_ONE, backend="postgres",
    why="the request's projection commits without its inbox rows: the frames are applied but not stored")
add("requestrows.full_rows_not_sent", ON_APPEND,
    "        if rows.full():\n            rows.send(tx)  # between two frames",
    "        if False:\n            rows.send(tx)  # between two frames",
    t(REQUEST_ROWS, "test_a_request_whose_rows_outgrow_one_statement_sends_them_in_several"), backend="postgres",
    why="a request's rows go out as one parameter however large (up to 1,000 frames of 1 MiB)")

# == D115: a batch's rows read once, changed in memory, written set-based =======================
# The SQL guard of each flush statement (the safety net behind the in-memory rules), dropped whole.
# guard.sql.bridge_messages replaces bridge_message.upsert_rows_update_sees_no_guard (PostgreSQL's
# one-statement message upsert is gone; the flush's one upsert carries the guard on both backends),
# and these together replace batch.ensure_guard_moved (the roster ensure sent ahead is gone).
GUARDED_IN_SQL = g("test_every_write_statement_is_guarded_in_sql")
add("guard.sql.identities", IDENT,
    '    f"updated_at_ms = excluded.updated_at_ms WHERE {IDENTITY_GUARD}",\n',
    '    "updated_at_ms = excluded.updated_at_ms",\n',
    GUARDED_IN_SQL,
    why="the identities' flush statement overwrites a row with what it already holds (a new updated_at_ms)")
add("guard.sql.conversations", CONVS,
    '    f"WHERE {CONVERSATION_GUARD}",\n', '    "",\n',
    GUARDED_IN_SQL,
    why="the conversations' flush statement rewrites a row it already holds")
add("guard.sql.participants", CONVS,
    '    "WHERE (conversation_participants.role, conversation_participants.display_name, "\n'
    '    "conversation_participants.is_active) IS DISTINCT FROM (excluded.role, excluded.display_name, "\n'
    '    "excluded.is_active)",\n',
    '    "",\n',
    GUARDED_IN_SQL,
    why="the roster's flush statement rewrites a member it already holds")
add("guard.sql.bridge_messages", BMSG,
    '    "WHERE (bridge_messages.sender_identity_id, bridge_messages.direction, bridge_messages.body, "\n',
    '    "WHERE true OR (bridge_messages.sender_identity_id, bridge_messages.direction, bridge_messages.body, "\n',
    GUARDED_IN_SQL,
    why="the messages' flush upsert drops the write guard: a message sent as stored rewrites its row")
add("guard.sql.reactions", REACT,
    '    "WHERE (reactions.reactor_identity_id, reactions.reactor_is_self, reactions.emoji, reactions.state, "\n',
    '    "WHERE true OR (reactions.reactor_identity_id, reactions.reactor_is_self, reactions.emoji, reactions.state, "\n',
    GUARDED_IN_SQL,
    why="the reactions' flush upsert rewrites a reaction it already holds")

# The batch's own mechanisms.
add("batch.journal_rollback_disabled", BATCH_ROWS_SRC,
    "    def rollback(self, mark: int) -> None:\n        undo = self._undo\n",
    "    def rollback(self, mark: int) -> None:\n        return\n        undo = self._undo\n",
    t(BATCH, "test_a_frame_that_fails_part_way_is_taken_back_whole_and_a_later_frame_never_sees_it"),
    why="a frame that fails part-way keeps what it changed in the batch's memory: a later frame builds on "
        "it and the flush writes it, though the frame was quarantined")
add("batch.flushed_before_every_frame", "src/tidings/ingest/apply.py",
    "    if own:\n        batch.flush()\n",
    "    batch.flush()\n",
    t(BATCH, "test_a_batch_writes_a_row_once_whatever_the_number_of_its_frames_that_changed_it"),
    why="the batch is flushed before every frame, not only before one that may call the link hook: a row "
        "a request's frames change is written once a frame")
add("batch.no_flush_before_a_hook_frame", "src/tidings/ingest/apply.py",
    "    if own:\n        batch.flush()\n",
    "",
    t(BATCH, "test_a_frame_that_may_call_the_hook_never_takes_an_earlier_frames_rows_down_with_it"),
    backend="both",
    why="a frame that may call the link hook starts its savepoint with earlier frames' rows unflushed: the hook's "
        "flush writes them inside it, and when the frame fails they go down with its savepoint")
add("batch.changed_back_still_sent", IDENT,
    "            if was is not None and was.content() == row.content():\n"
    "                table.put(key, was)  # changed and changed back: nothing to write\n"
    "                continue\n",
    "",
    t(BATCH, "test_a_batch_writes_a_row_once_whatever_the_number_of_its_frames_that_changed_it"),
    why="an identity renamed and renamed back within a batch is still sent (only the SQL guard keeps it)")
add("batch.hook_sees_unflushed_rows", PROJ_SRC,
    "            self.batch.flush()\n            on_message(self.tx, change)\n",
    "            on_message(self.tx, change)\n",
    t(BATCH, "test_the_link_hook_sees_the_rows_of_its_frame_and_of_the_batchs_earlier_frames"),
    why="the link hook is called before the frame's rows are flushed: it reads a store without the "
        "message it is told about, or its sender")
add("batch.unknown_key_taken_as_absent", BATCH_ROWS_SRC,
    "        if key not in self.rows:\n            self.want(key)\n            read_all(tx, reads())\n",
    "        if key not in self.rows:\n            self.load(key, None)\n",
    t(BATCH, "test_a_row_not_asked_for_ahead_is_read_when_first_used"),
    why="a row the batch did not ask for ahead is taken for absent instead of read: a stored sender is "
        "inserted again over its row")
add("batch_rows.load_overwrites_known", BATCH_ROWS_SRC,
    "        if key in self.rows:\n            return\n        self.read[key] = row\n",
    "        self.read[key] = row\n",
    t(BATCH, "test_a_read_that_brings_a_row_again_never_takes_back_what_the_batch_made_of_it"),
    why="a second read of a key the batch changed puts the stored row back over the change: the change "
        "is never written")
add("batch.reads_not_announced", BATCH_SRC,
    "        for stmt, params, _ in reads:\n            tx.read_ahead(stmt, params)\n        self._reads.extend(reads)\n",
    "        self._reads.extend(reads)\n",
    t(BATCH, "test_a_batch_reads_every_row_it_asked_for_in_one_round_trip"),
    backend="postgres",
    why="the batch's reads are not announced ahead: one round trip a table family instead of one for all")
# The families are made on first use; the flush must still write parents first, not in the
# order the families were made.
add("batch.flush_in_the_order_made", BATCH_SRC,
    "        for name in _FAMILIES:\n            family = made.get(name)\n"
    "            if family is not None:\n                family.flush(send)",
    "        for name in list(made):\n            family = made.get(name)\n"
    "            if family is not None:\n                family.flush(send)",
    t(BATCH, "test_a_batch_makes_only_the_families_its_frames_use_and_writes_them_parents_first"),
    why="a batch whose message family was made before its conversation's writes the message first: "
        "a broken foreign key")
# ``Tx.callbacks`` and a batched frame's unit are plain classes (no generator): a failed
# unit must still drop its callbacks, and a failed frame must still be taken back.
add("engine.callbacks_keeps_a_failed_units", ENGINE,
    "            del self.tx._after[self.mark:]\n",
    "            pass\n",
    t("tests/test_store_engine.py", "test_a_callbacks_unit_that_fails_drops_only_its_own_after_commit_callbacks"),
    why="a failed unit's after-commit callbacks run at the commit, as if it had succeeded")
add("apply.batched_frame_not_taken_back", APPLY_SRC,
    "            self.inner.__exit__(kind, exc, tb)  # (rolls the journal back on error)\n",
    "            pass\n",
    t(BATCH, "test_a_frame_that_fails_part_way_is_taken_back_whole_and_a_later_frame_never_sees_it"),
    why="a frame of a batch that fails part way leaves its changes in the batch's rows")
add("counters.add_partly", "src/tidings/counters.py",
    "            for name in counts:\n                if name not in values:\n"
    "                    raise KeyError(f\"unknown counter {name!r}\")\n",
    "",
    t("tests/test_counters.py", "test_add_adds_every_count_under_one_lock_or_none_when_a_name_is_unknown"),
    why="a frame's staged counts with an unknown name are added in part before the error")
# The write transaction is a plain class (no ``with lock``): it releases SQLite's writer lock
# by hand, whether its BEGIN or its COMMIT fails.
add("engine.begin_failure_keeps_writer_lock", ENGINE,
    "            except BaseException:\n                lock.release()\n                raise\n",
    "            except BaseException:\n                raise\n",
    t("tests/test_store_engine.py", "test_a_write_whose_begin_or_commit_fails_releases_the_writer_lock"),
    why="a write whose BEGIN IMMEDIATE fails keeps the writer lock: every other writer waits forever")
add("engine.commit_failure_keeps_writer_lock", ENGINE,
    "            finally:\n                self.store._writer_lock.release()\n",
    "            finally:\n                if kind is not None:\n                    self.store._writer_lock.release()\n",
    t("tests/test_store_engine.py", "test_a_write_whose_begin_or_commit_fails_releases_the_writer_lock"),
    why="a write whose COMMIT fails keeps the writer lock: every other writer waits forever")
add("drain.bridge_lock_not_taken", APPLY_SRC,
    "                if row is not None:\n"
    "                    # Every writer of a bridge's projection rows holds its lock (ingest/batch.py).\n"
    "                    inbox_store.lock_bridge_appends(tx, row[0])\n",
    "",
    t(BATCH, "test_the_drain_takes_the_bridges_lock_before_it_reads_a_frames_rows"),
    backend="postgres",
    why="the drain projects a frame without the bridge's lock: an append applying on another connection "
        "changes the rows its batch read, and one of the two writes over the other")
add("batch_rows.probe_without_fence", BATCH_ROWS_SRC,
    'f"WHERE {match} AND {where} OFFSET 0) t"', 'f"WHERE {match} AND {where}) t"',
    t(BATCH, "test_a_set_read_probes_an_index_a_key_even_in_a_generic_plan"),
    backend="postgres",
    why="a set read without its OFFSET 0 fence is flattened into a join: a prepared statement's generic "
        "plan scans the table whole")
add("batch.request_projected_last_first", ON_APPEND,
    "        decoded, rows, batch = self.decoded[index], cast(RequestRows, self.rows), self.batch\n",
    "        decoded, rows, batch = self.decoded[-1 - index], cast(RequestRows, self.rows), self.batch\n",
    t(APPEND, "test_a_request_is_applied_in_its_own_commit_with_each_inbox_row_written_once"),
    t(BATCH, "test_a_batch_writes_a_row_once_whatever_the_number_of_its_frames_that_changed_it"),
    why="a request decoded ahead is projected last frame first: the batch applies its frames out of "
        "receipt order (a rename undone, each row marked with another frame's outcome)")
add("batch.hook_frame_savepoint_dropped", "src/tidings/ingest/apply.py",
    "    own = decoded is not None and decoded.events is not None and projection.may_call_hook(batch, decoded.events)\n",
    "    own = False\n",
    t(BATCH, "test_a_frame_that_fails_after_the_link_hook_ran_leaves_neither_its_rows_nor_the_hooks_writes"),
    why="a frame that may call the link hook runs without its own savepoint: when it fails after the hook "
        "wrote (posted into a channel), the hook's writes stay while the frame is quarantined")
# D122: the stuck fault of the replay harness and the stuck bench is a projection seam that
# hands each frame on to the real projection, so the frames it does not fail are batched.
STUCK_FIDELITY = "test_beside_the_stuck_fault_a_frame_that_is_not_stuck_costs_what_it_costs_without_it"
add("harness.stuck_fault_unbatched", APPLY_SRC,
    '        return project is projection.project_frame or getattr(project, "batches", False) is True\n',
    "        return project is projection.project_frame\n",
    t("tests/replay/test_replay.py", STUCK_FIDELITY),
    backend="both",
    why="a seam that wraps the real projection turns batching off: beside the stuck fault every later frame "
        "takes a savepoint and reads its rows in a round trip of its own, and the stuck bench measures a path "
        "production never takes")
add("append.broken_append_left_uncounted", "src/tidings/ingest/engine.py",
    '                    self.counters.of(bridge_id).incr("left_for_worker", left)\n',
    "                    pass\n",
    t("tests/replay/test_replay.py", STUCK_FIDELITY),
    why="frames appended again without apply on append, after it broke the transaction, are left for the "
        "drain uncounted: left_for_worker hides them")
# == D123: owed rows recorded on one node reach the session on another ==========================
ROUTING_CLUSTER = "tests/cluster/test_cluster_routing.py"
OWED_LATE = "test_a_mention_owed_after_the_agent_connected_elsewhere_is_steered_to_that_session"
add("cluster.owed_hint_not_sent", "src/tidings/store/owed.py",
    '"SELECT (SELECT count(*) FROM owed), (SELECT count(*) FROM marked), (SELECT count(*) FROM notified)"',
    '"SELECT (SELECT count(*) FROM owed), (SELECT count(*) FROM marked)"',
    t(ROUTING_CLUSTER, OWED_LATE),
    backend="postgres",
    why="the owed hint's CTE is never referenced, so PostgreSQL never sends it: a mention owed after its "
        "agent connected on another node waits there for a reconnect")
add("cluster.owed_hint_ignored", "src/tidings/delivery/consumer.py",
    "            self.sweeper.owed_again(payload.agent_ids)\n",
    "            pass\n",
    t(ROUTING_CLUSTER, OWED_LATE),
    backend="postgres",
    why="the node holding the session drops the owed hint: the late owed mention is never steered to it")
add("cluster.live_steer_unrecorded", "src/tidings/delivery/routing.py",
    '                self.steered_here.setdefault(session.session_id, set()).add(message["id"])\n',
    "                pass\n",
    t(ROUTING_CLUSTER, "test_a_post_on_one_node_steers_and_delivers_to_sessions_on_the_others"),
    backend="postgres",
    why="a live steer is not remembered for its session: the owed hint that follows steers it again")
add("cluster.owed_sweep_repeats_what_it_steered", "src/tidings/delivery/sweeps.py",
    '            elif row["id"] in steered:\n',
    "            elif False:\n",
    t(ROUTING_CLUSTER, "test_a_post_on_one_node_steers_and_delivers_to_sessions_on_the_others"),
    backend="postgres",
    why="the owed sweep leaves out nothing already steered to the session: the owed hint repeats a live steer")
# == a reader's keep-alive timer outlives its waits (Session.next) ============================
SESSION_SRC = "src/tidings/delivery/sessions.py"
SESSION_TIMER = "tests/delivery/test_session_timer.py"
add("sessions.alarm_ends_any_wait", SESSION_SRC,
    "        if deadline <= at:\n            _expire(waiter[1])\n",
    "        if True:\n            _expire(waiter[1])\n",
    t(SESSION_TIMER, "test_each_wait_still_ends_at_its_own_deadline"),
    why="the timer armed for an earlier wait ends a later one before its deadline: keep-alives come early")
add("sessions.shorter_wait_keeps_later_alarm", SESSION_SRC,
    "            if at is None or at > deadline or self._alarm_loop is not loop:\n",
    "            if at is None or self._alarm_loop is not loop:\n",
    t(SESSION_TIMER, "test_each_wait_still_ends_at_its_own_deadline"),
    why="a wait with a shorter timeout waits for the timer a longer one armed: its keep-alive comes late")
add("sessions.alarm_per_wait", SESSION_SRC,
    "            if at is None or at > deadline or self._alarm_loop is not loop:\n",
    "            if True:\n",
    t(SESSION_TIMER, "test_a_reader_woken_for_every_item_arms_one_timer_not_one_per_wait"),
    why="every wait arms a timer of its own again (the cost this timer removed)")
add("sessions.timer_on_another_loop_trusted", SESSION_SRC,
    "            if at is None or at > deadline or self._alarm_loop is not loop:\n",
    "            if at is None or at > deadline:\n",
    t(SESSION_TIMER, "test_a_reader_on_a_new_loop_gets_its_own_timer"),
    why="a reader on a new loop counts on the timer left on the old one: its waits never time out")
# == SQLite's WAL checkpoints run beside the writer (D128) ====================================
CHECKPOINT_SRC = "src/tidings/store/checkpoints.py"
CHECKPOINT_TESTS = "tests/test_store_checkpoints.py"
add("checkpoints.no_backstop", "src/tidings/store/engine.py",
    '    cur.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")  # the backstop (D128)\n',
    "",
    t(CHECKPOINT_TESTS, "test_a_commit_past_sqlites_default_does_not_checkpoint_below_the_backstop"),
    why="a commit still checkpoints at SQLite's default 1,000 pages: the wait the thread was for stays")
add("checkpoints.backstop_off", "src/tidings/store/engine.py",
    '    cur.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")  # the backstop (D128)\n',
    '    cur.execute("PRAGMA wal_autocheckpoint=0")\n',
    t(CHECKPOINT_TESTS, "test_the_backstop_still_checkpoints_a_wal_the_thread_leaves"),
    why="no backstop: a WAL the thread cannot keep up with grows without bound")
add("checkpoints.commit_not_counted", "src/tidings/store/engine.py",
    "                    checkpointer.committed()  # (under the writer lock: the count needs no lock)\n",
    "                    pass\n",
    t(CHECKPOINT_TESTS, "test_every_nth_commit_wakes_the_thread_which_copies_the_wal_back"),
    why="commits never wake the thread: only the backstop ever checkpoints")
add("checkpoints.count_not_reset", CHECKPOINT_SRC,
    "            self._since = 0\n",
    "            pass\n",
    t(CHECKPOINT_TESTS, "test_every_nth_commit_wakes_the_thread_which_copies_the_wal_back"),
    why="after its first wake the thread is woken by every commit")
add("checkpoints.failure_ends_thread", CHECKPOINT_SRC,
    "        except Exception as exc:  # noqa: BLE001 - the thread must live; the backstop still holds\n",
    "        except ZeroDivisionError as exc:\n",
    t(CHECKPOINT_TESTS, "test_a_failed_checkpoint_is_counted_and_logged_and_the_next_wake_tries_again"),
    why="a failed checkpoint ends the thread: no checkpoint runs beside the writer again")
add("checkpoints.dispose_leaves_thread", "src/tidings/store/engine.py",
    "            self.checkpointer.close()\n",
    "            pass\n",
    t(CHECKPOINT_TESTS, "test_dispose_stops_the_thread"),
    why="a disposed store leaves its checkpoint thread behind")
# == a frame's batch holds no reference cycle ===================================================
add("batch.rosters_hold_their_conversations", "src/tidings/store/conversations.py",
    "        self.rosters = Rosters(tx, journal, bridge_id, weakref.proxy(self))\n",
    "        self.rosters = Rosters(tx, journal, bridge_id, self)\n",
    t("tests/ingest/test_fast_path.py", "test_an_applied_frame_leaves_no_reference_cycle_behind"),
    backend="both",
    why="the rosters hold their conversations back: every batch is a cycle left to the garbage collector")
add("checkpoints.waits_for_readers", CHECKPOINT_SRC,
    'PRAGMA wal_checkpoint(PASSIVE)")',
    'PRAGMA wal_checkpoint(FULL)")',
    t(CHECKPOINT_TESTS, "test_the_thread_copies_what_it_can_and_never_waits_for_a_reader"),
    why="the thread's checkpoint waits for readers on older snapshots (and holds up the writer behind it)")
