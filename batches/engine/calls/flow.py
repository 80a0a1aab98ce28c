"""Adaptive concurrency: how many calls this engine keeps in flight at one deployment.

A deployment's `max_concurrency` is a ceiling, not a target. Each engine
keeps a `FlowControl` for its part of it (fairness.split) and moves the
limit between a floor and that part, from what the server's answers say:

- **Overload** (a 429, a 503, a call cut by the idle timeout or the call
  limit, a failed server): the limit is multiplied by BACKOFF, at most once
  a window, and only for calls sent after the last cut (they saw the old
  limit).
- **A refusal** (a 503: the server's queue is full) also teaches a ceiling:
  the calls this engine had in flight when it sent the refused one, less
  one. The limit stays at or under it for OPENRELAY_CEILING_HOLD_S (each
  503 starts the hold again, and the lowest such ceiling of a hold counts);
  after a hold without one it grows past it again, a call a window. The
  calls of one burst the server refused count as not held (`_learn`); and
  the other engines hear of the refusal at once (peers.Peers.refused,
  through their watch) and stop slow start where they stand (`peer_refused`).
  Each engine's ceiling is what it had in flight at a different moment of
  the burst, so their sum can fall short of what the server holds: a random
  1-2x BURST_S after the hold began, the ceiling creeps up a call a BURST_S
  until the next refusal (met or heard) finds the edge again (`_creep`).
- **Latency** (Vegas): each window (as many answers as the limit, about
  one round trip of every slot) gives a mean call time. The baseline is the
  lowest window mean of the last BASELINE_S (or of 40 call times, up to
  5 minutes: `_baseline_life`). The calls waiting inside the
  server are estimated as in flight x (1 - baseline / mean) (Little's law:
  the share of a call's time it did not run); the limit is held so that
  at most OPENRELAY_QUEUE_LINE of the calls in flight (at least one) wait:
  it shrinks by what waits past that, and grows only while less waits. A mean
  above OPENRELAY_LATENCY_TOLERANCE x the baseline cuts harder, to where
  calls would not queue (or to the line, if lower). The limit grows by
  doubling while it has never been cut (slow start), then by one a window;
  it only grows while calls actually fill it. A drain probe keeps the
  baseline unqueued: when it is about to age out and no window since came
  near it, the limit is held at half for one window (BBR's ProbeRTT), whose
  mean is a fresh baseline, then restored; without it, against a server that
  queues without end past its slots, the baseline rose to a queued mean each
  minute and the limit with it (4 slots: 52 in flight after 10 minutes).
- **The server's own figures**, when GET /metrics answers (vLLM:
  `vllm:num_requests_waiting`, `vllm:num_requests_running`, KV-cache usage;
  llama.cpp: `llamacpp:requests_deferred`, `llamacpp:requests_processing`):
  they replace the latency rule. The limit moves so that a short line waits
  in the server (WAIT_SHARE of what runs, at least one request, so no slot
  idles between an answer and the next call) and no longer, by this
  engine's part of the server's load; a full KV cache stops growth.

Why these: measured against the capacity-model simulator (16 slots), a
fixed limit 8x too high kept 112 requests queued in the server (or drew
503s past its queue limit); AIMD on errors alone saws between the queue
limit and half of it, an error each cycle; the latency rule settles where
the slots are full and little queues; the server's waiting count does that
directly, without a latency baseline to learn. The line and the learned
ceiling are issue 55's: a server whose queue is no longer than its slots
never shows calls taking 2x their baseline before it refuses (Little's law),
so the tolerance alone left AIMD sawing into 503s, 1.1-1.3% of the calls
all run long; a server without a queue shows no latency at all, only 503s.
docs/concepts/flow-control.md says what an operator sets and sees; docs/performance.md has the benchmark rows.
"""

import asyncio
import logging
import math
import random
import time
from collections import defaultdict, deque

from batches.engine.calls.transport import TransportError
from batches.figures import Figures

logger = logging.getLogger("openrelay.engine")

BACKOFF = 0.7  # an overload signal multiplies the limit by this
SLOW_START_EXIT = 1.25  # slow start ends once calls take this much over their baseline
BASELINE_S = 60.0  # the latency baseline is the lowest window mean this recent
# ... or this many call times, if longer, up to BASELINE_MAX_S: a drain probe (`_start_probe`) renews an
# old baseline at the cost of about a call time at half the limit, so a baseline of long calls lives
# longer (calls of 10 s: a probe every 300 s, ~2.5% of the calls; every 60 s it was ~8%). The cap: a
# baseline learned queued (a start above the slots) is only renewed by a probe, and each halves the queue.
BASELINE_CALLS = 40
BASELINE_MAX_S = 300.0
PROBE_SHARE = 0.5  # a drain probe holds the limit at this share of itself for one window
# Below this, a rise in call time is noise, not a queue: a fast server's calls take
# 1-10 ms, and their mean doubles with scheduling jitter alone.
MIN_QUEUE_DELAY_S = 0.05
# Slow start ends on a rise over this (and SLOW_START_EXIT x the baseline): ending it on jitter
# costs only the ramp, where the line (which waits for MIN_QUEUE_DELAY_S) would cost throughput.
SLOW_START_NOISE_S = 0.02
SLOW_START_SAMPLES = 8  # answers of a window that may end slow start before the window does
REFUSED = 503  # a full queue: the status whose calls in flight teach a ceiling
BURST_S = 2.0  # refusals this recent may have been in flight when another was sent (a burst)
BURST_MAX = 64  # and at most this many of them are weighed against each other
METRICS_EVERY_S = 0.5
METRICS_TIMEOUT_S = 2.0
METRICS_RETRY_S = 60.0  # a server with no usable /metrics is asked again this much later
METRICS_FRESH_S = 3.0  # figures older than this no longer steer the limit
WAIT_SHARE = 1 / 8  # the line the server should keep: this share of what it runs
KV_FULL = 0.95

WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred")
RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio")


def peer_limits(live, owner):
    """{deployment pk: the other live engines' adaptive limits there} from the heartbeat's
    (owner, held, published) rows: what `FlowControl.level_with` moves this engine's limit towards.

    An engine publishes a limit of 0 until its part of max_concurrency is set (its first heartbeats):
    that is no limit to level with. Counted, it halved the others' limits at every start (four engines
    at a 16-slot server: 2.5 and 5.8 where they had 5 and 10 in flight), and the hold a refusal taught
    next kept them there (row 18: 73% of the server's rate)."""
    limits = defaultdict(list)
    for peer, _, published in live:
        if peer == owner:
            continue
        for deployment, figures in (published or {}).items():
            limit = Figures.stored(figures).limit
            if limit:
                limits[int(deployment)].append(limit)
    return limits


class FlowControl:
    """One deployment's adaptive limit in this engine.

    `limit` (an int, between `floor` and `ceiling`) is what the gate hands
    out; `observe` is called with every answer, `overloaded` with every
    overload signal, `metrics` with the server's figures.
    """

    def __init__(self, ceiling, *, floor=1, start=None, tolerance=2.0, line=0.25, hold_s=30.0, adaptive=True):
        self.ceiling = max(0, ceiling)
        self.floor = max(1, floor)
        self.adaptive = adaptive
        self.tolerance = tolerance
        self.line = line  # the share of the calls in flight that may wait in the server (0: no line)
        self.hold_s = hold_s  # how long a 503's ceiling holds (0: none is learned)
        self.learned = None  # the calls in flight past which the server refused, while held
        self.held_until = -math.inf
        # When the hold began; when its creep begins (`_creep`; inf: no creep this hold), and when it may
        # take its next step. A refusal (met or heard) past the hold's burst found the edge: no creep.
        self.hold_began = -math.inf
        self.creep_from = self.creep_at = math.inf
        self.news = False  # a refusal the other engines should hear of (peers.Peers.refused)
        self.refusals = deque()  # (sent at, calls in flight then, answered at) of the hold's recent 503s
        self.value = float(self.ceiling if start is None or not adaptive else start)
        self.start = self.value  # where it started (the engine's part of the deployment's start)
        self.slow_start = True
        self.cut_at = -math.inf  # when the limit was last cut (time.monotonic): older calls don't cut again
        self.means = deque()  # (when, window mean): the baseline's candidates, oldest (and lowest) first
        self.probe = None  # (when a drain probe began, the limit it restores) while one runs
        self.server = None  # (when, waiting, running, kv usage) from /metrics
        self.steered_at = -math.inf  # the reading the limit last moved by: each moves it once
        self._clamp()
        self._reset_window()

    @property
    def limit(self):
        return self._limit

    def set_ceiling(self, ceiling):
        ceiling = max(0, ceiling)
        if self.learned is not None and self.ceiling and ceiling and ceiling != self.ceiling:
            # The engine's part of max_concurrency moved (an engine joined or left): so did its
            # part of what the server holds.
            self.learned = max(self.floor, round(self.learned * ceiling / self.ceiling))
        self.ceiling = ceiling
        if not self.adaptive:
            self.value = float(self.ceiling)
        self._clamp()

    @property
    def top(self):
        """Where growth stops: the engine's part of max_concurrency, or a held 503's ceiling under it."""
        top = max(self.ceiling, self.floor)
        return top if self.learned is None else max(self.floor, min(top, self.learned))

    def _clamp(self):
        # `value` keeps its place while the ceiling moves (an engine's part is 0 until it has
        # published it, and shrinks while another engine joins); growth stops at the ceiling.
        self.value = max(self.value, self.floor)
        if self.learned is not None:
            self.value = min(self.value, max(self.floor, self.learned))
        self._limit = min(int(self.value), self.ceiling)

    def _grow(self, step):
        self.value = min(self.value + step, self.top)

    # ------------------------------------------------------------ signals

    def observe(self, seconds, in_flight, now):
        """An answer that took `seconds`, with `in_flight` calls (this one included) at the deployment."""
        if not self.adaptive:
            return
        if self.probe is not None and now - seconds < self.probe[0]:
            return  # sent before the drain probe: it queued behind the limit the probe lowered
        self.window_calls += 1
        self.window_seconds += seconds
        self.window_in_flight += in_flight
        if in_flight > self.window_peak:
            self.window_peak = in_flight
        if self.slow_start:
            self._slow_start(in_flight)
        if self.window_calls >= self.window_size:
            self._end_window(now)

    def _slow_start(self, in_flight):
        """One more a full answer (the limit doubles every round trip while nothing pushes back),
        until this window's first answers take longer than the baseline (HyStart's delay rule):
        a window's end is a round trip late, and a doubling too many filled a queue as long as
        the slots and drew a burst of 503s (issue 55)."""
        calls = self.window_calls
        if calls >= SLOW_START_SAMPLES and self.means:
            mean, baseline = self.window_seconds / calls, self.means[0][1]
            if mean > SLOW_START_EXIT * baseline and mean - baseline > SLOW_START_NOISE_S:
                self.slow_start = False
                return
        if in_flight >= self._limit:
            self._grow(1)
            self._clamp()

    def overloaded(self, sent_at, now, status=None, sent_with=None):
        """The server said it is overloaded to a call sent at `sent_at` (time.monotonic) with
        `sent_with` calls in flight (itself included); `status` is its answer's (None: cut for time)."""
        if not self.adaptive:
            return
        cut = sent_at >= self.cut_at  # a call sent after the last cut: it saw the limit that led here
        if status == REFUSED and sent_with and self.hold_s > 0:
            # The server said how many it takes: the limit goes there, not to a backoff under it
            # (which left room for the other engines to grow into and be refused in turn), unless
            # it refused what it took before (its room shrank: back off as well).
            # A creep's step that met the edge (`_creep`) goes back to the ceiling under it: no backoff.
            held = self._holding(now) and now < self.creep_from
            cut = cut and held and sent_with <= self.learned
            self.slow_start = False
            self._learn(sent_at, sent_with, now)
        if cut:
            self.slow_start = False
            self.value *= BACKOFF
            self.cut_at = now
        self._clamp()
        if cut or status == REFUSED:
            self._reset_window()

    def _learn(self, sent_at, sent_with, now):
        """A refused call: the calls in flight when it was sent, less itself, were all the server would
        take beside the other engines'. Every refusal of a burst says so (the burst that slow start's
        last doubling sends), not only the first, so the lowest of a hold is kept; and the calls of
        a burst were in flight when the later ones were sent, though the server held none of them:
        each counts only the calls in flight at its sending that were not refused (four of eight
        refused at once left a ceiling of 7 each, 28 where 4 engines had 16 slots: issue 55)."""
        refusals = self.refusals
        fresh = not self._holding(now)
        if fresh:
            self.learned = None
            refusals.clear()
        self.news = fresh or now >= self.creep_from  # a new hold, or a creep that found the edge
        self._refused(now, fresh)
        while refusals and (now - refusals[0][2] > BURST_S or len(refusals) >= BURST_MAX):
            refusals.popleft()
        refusals.append((sent_at, sent_with, now))
        calls = min(
            with_ - 1 - sum(1 for other in refusals if other is not refusal and other[0] <= sent < other[2])
            for refusal in refusals
            for sent, with_, _ in [refusal]
        )
        self.learned = max(self.floor, calls if self.learned is None else min(self.learned, calls))
        self.held_until = now + self.hold_s
        self._clamp()

    def peer_refused(self, in_flight, now):
        """Another engine was just refused a call here: the server is full. Stop growing, and hold
        the `in_flight` calls out now as if refused itself; an engine holding a
        ceiling already holds it longer. An engine still doubling took the room the refused ones
        gave back and was refused in turn; engines whose holds ran out together probed the server
        together, four refusals a step (issue 55). So a hold heard of lasts a random 1-1.5x
        OPENRELAY_CEILING_HOLD_S, past the refused engine's own: one engine probes at a time."""
        if not self.adaptive:
            return
        self.slow_start = False
        if self.hold_s <= 0:
            self.value = max(float(self.floor), min(self.value, float(in_flight)))
        else:
            fresh = not self._holding(now)
            if fresh:
                # What the server holds of this engine's: its calls out, even past a limit that was
                # just levelled down (which `_clamp` still keeps the limit under, growing back a call a window).
                self.learned = max(self.floor, in_flight)
            self._refused(now, fresh)
            self.held_until = max(self.held_until, now + self.hold_s * random.uniform(1.0, 1.5))
        self._clamp()
        self._reset_window()

    def _holding(self, now):
        """Whether a 503's ceiling holds the limit now."""
        return self.learned is not None and now < self.held_until

    def _refused(self, now, fresh):
        """A refusal, this engine's or another's: a new hold's creep begins a random 1-2x BURST_S
        later (past the burst; the engines that heard of one refusal together step apart, not four
        at once into a full server). A refusal BURST_S or more into the hold is no longer its burst's:
        a creep (this engine's or another's) found the edge, and none goes on this hold. Stopping
        only a creep under way let each engine that had not begun its own yet step into the full
        server in turn: four refusals where one told them all."""
        if fresh:
            self.hold_began = now
            self.creep_from = self.creep_at = now + BURST_S * random.uniform(1.0, 2.0)
        elif now - self.hold_began >= BURST_S:
            self.creep_from = self.creep_at = math.inf

    def _creep(self, now, filled):
        """Raise a hold's ceiling by a call, at most one a BURST_S, from a random 1-2x BURST_S after it
        began until a refusal. Each engine learned its ceiling from what it had in flight when it met or
        heard of the burst's refusals, moments apart while every engine's calls came and went: measured
        on four engines at a 16-slot server without a queue, their ceilings added up to 14 (9 once) and
        held there all run (91% of the server's rate; 73%). The creep finds the missing slots in a few
        seconds, at the cost of the refusal that ends it; then the hold keeps its ceiling."""
        if filled and self._holding(now) and now >= self.creep_at:
            self.learned = min(self.learned + 1, max(self.ceiling, self.floor))
            self.creep_at = now + BURST_S

    def release(self, now):
        """A hold that saw no refusal ends: the limit grows past its ceiling again, a call a window
        (re-probing the server once a hold, not each time it grows back)."""
        if self.learned is not None and now >= self.held_until:
            self.learned = None

    def level_with(self, level):
        """Move halfway to `level`, the other engines' mean limit at this deployment (heartbeat).

        Each engine learns from its own calls, and one whose baseline was measured on a quiet
        server reads the queue another engine built as its own: measured with two engines on
        one 8-slot server, one engine's limit sank to 1-2 while the other's grew, and the
        records claimed by the first crawled (2 a second). Meeting halfway every heartbeat
        keeps the sum and evens the parts, as the even split of max_concurrency assumes.

        An engine holding a 503's ceiling does not move: the server told it where it stands
        beside the others, and moving it down would leave their sum under what the server
        holds, for the others to probe into again.
        """
        if self.adaptive and self.learned is None:
            self.value = (self.value + level) / 2
            self._clamp()

    def absorb(self, calls, in_flight):
        """Take over the calls a dead engine held here (batches.engine.liveness) on top of this
        engine's own (its limit, or its calls in flight if more): the engines' calls still add up
        to what the server took. Left to grow back by answers, the survivor of a kill -9 sent the
        dead engine's calls again one 3 s call round per step."""
        if self.adaptive:
            if self.learned is not None:
                self.learned += calls  # the server held those calls too
            self.value = max(self.value, in_flight) + calls
            self._clamp()

    def metrics(self, waiting, running, kv_usage, now):
        """The server's own figures (waiting and running requests, KV-cache usage 0..1 or None)."""
        self.server = (now, waiting, running, kv_usage)
        if self.slow_start and waiting > 2 * max(1.0, running * WAIT_SHARE):
            self.slow_start = False  # a line formed: stop doubling now, not a window later

    # ------------------------------------------------------------ windows

    def _reset_window(self):
        # A window is as many answers as the limit when it began (slow start grows it meanwhile).
        self.window_size = max(1, self._limit)
        self.window_calls = 0
        self.window_seconds = 0.0
        self.window_in_flight = 0
        self.window_peak = 0

    def _end_window(self, now):
        mean = self.window_seconds / self.window_calls
        in_flight = self.window_in_flight / self.window_calls
        self.release(now)
        filled = self.window_peak >= self._limit  # the limit, not the work, held calls back
        self._creep(now, filled)
        baseline = self._baseline(mean, now)
        if self.probe is not None:
            self._end_probe()
        elif self.server is not None and now - self.server[0] <= METRICS_FRESH_S:
            if self.slow_start and mean - baseline > MIN_QUEUE_DELAY_S and mean > SLOW_START_EXIT * baseline:
                self.slow_start = False  # calls begin to wait before the next reading says so
            if self.server[0] > self.steered_at:  # a window is shorter than a reading's interval
                self.steered_at = self.server[0]
                self._steer_by_server(filled)
        elif not self.slow_start and self._baseline_expires(mean, now):
            self._start_probe(now)
        else:
            self._steer_by_latency(mean, baseline, in_flight, filled)
        self._clamp()
        self._reset_window()

    def _baseline(self, mean, now):
        """The lowest window mean of the last BASELINE_S, this one included.

        `means` keeps only the windows that could still be the lowest (each lower than every
        later one), so the lowest is the first: a fast server ends ~100 windows a second, and
        a min() over a minute of them cost every window a pass over thousands.
        """
        means = self.means
        while means and means[-1][1] >= mean:
            means.pop()
        means.append((now, mean))
        life = self._baseline_life(mean)
        while now - means[0][0] > life:
            means.popleft()
        return means[0][1]

    @staticmethod
    def _baseline_life(mean):
        """How long a window's mean may stay the baseline: BASELINE_S, or BASELINE_CALLS calls' time up
        to BASELINE_MAX_S."""
        return max(BASELINE_S, min(BASELINE_CALLS * mean, BASELINE_MAX_S))

    def _baseline_expires(self, mean, now):
        """The baseline's window ages out about when a probe could replace it (two windows of
        `mean` from now: one drains the calls sent before it, one measures), and no window since
        came within MIN_QUEUE_DELAY_S of it (`means` rises from the baseline: the next is the
        lowest since)."""
        (when, baseline), means = self.means[0], self.means
        if now - when + 2 * mean < self._baseline_life(mean):
            return False
        return len(means) < 2 or means[1][1] - baseline > MIN_QUEUE_DELAY_S

    def _start_probe(self, now):
        """Hold the limit at PROBE_SHARE of itself for one window, so that window runs unqueued and
        its mean is a fresh baseline (BBR's ProbeRTT, at half the window as BBRv2's).

        Against a server that queues without end past its slots (llama.cpp, Ollama, vLLM without
        a queue limit), no window runs unqueued once the limit is past the slots: each minute the
        lowest mean aged out, the baseline rose to a queued mean and the limit grew again (a model
        of 4 slots: 52 calls in flight after 10 minutes from a start of 2, 110 from 16, where the
        line means 5-6). Half: held at the line, a quarter of the calls wait and the rest run, so
        half of them all runs unqueued; from a queued baseline each probe halves what queues. The
        cost: one window a minute with half the slots busy (calls of 0.3 s: 0.25%; longer calls probe
        less often: BASELINE_CALLS),
        and none while a window near the baseline keeps it fresh."""
        self.probe = (now, self.value)
        self.value = max(self.floor, self.value * PROBE_SHARE)

    def _end_probe(self):
        """The probe's window is in (`_baseline` took its mean): back to the limit before it, unless
        an overload cut the limit meanwhile (then it grows back from there)."""
        began, value = self.probe
        self.probe = None
        if self.cut_at < began:
            self.value = value

    def _steer_by_latency(self, mean, baseline, in_flight, filled):
        queueing = mean - baseline > MIN_QUEUE_DELAY_S
        if self.slow_start and queueing and mean > SLOW_START_EXIT * baseline:
            # Calls begin to wait: stop doubling before the burst overshoots (HyStart's rule).
            self.slow_start = False
        waiting, line = self.waiting(mean, baseline, in_flight)
        if mean > self.tolerance * baseline and queueing:
            # Calls queue in the server: shrink towards where they would take `tolerance` x the baseline,
            # or to the line if that is lower (just past the tolerance, its cut is nil: a probe's fresh
            # baseline at half the limit read 2.0x and left a limit of 14 against 4 slots).
            self.slow_start = False
            self.value = max(
                self.value * BACKOFF, min(self.value * self.tolerance * baseline / mean, self.value - (waiting - line))
            )
        elif waiting > line:
            # Past the line: take back what waits beyond it (at most a backoff's worth a window).
            self.slow_start = False
            self.value = max(self.value * BACKOFF, self.value - (waiting - line))
        elif filled and not self.slow_start:
            self._grow(1)

    def waiting(self, mean, baseline, in_flight):
        """(the calls estimated waiting in the server, the line they are held to) for a window whose
        calls took `mean` against the `baseline` with `in_flight` in flight on average. Without a
        line, or under MIN_QUEUE_DELAY_S (an engine's own loop, busy with more calls, slows what it
        measures: a 20 ms server read 40 ms a call beside other work), nothing is estimated waiting."""
        if self.line <= 0 or mean - baseline <= MIN_QUEUE_DELAY_S:
            return 0.0, math.inf
        return in_flight * (1 - baseline / mean), max(1.0, self.line * in_flight)

    def _steer_by_server(self, filled):
        _, waiting, running, kv_usage = self.server
        if kv_usage is not None and kv_usage >= KV_FULL:
            self.slow_start = False  # the server has no room left for more, whatever its line says
        wanted = max(1.0, running * WAIT_SHARE)
        load = max(1, running + waiting)
        ours = min(1.0, self.value / load)  # this engine's part of what the server holds
        if waiting > 2 * wanted:
            self.slow_start = False
            self.value -= (waiting - wanted) * ours
        elif waiting < wanted and filled and not self.slow_start and (kv_usage is None or kv_usage < KV_FULL):
            self._grow(max(1.0, (wanted - waiting) * ours))


# ---------------------------------------------------------------- the server's /metrics


def read_metrics(text):
    """(waiting, running, kv usage or None) from a Prometheus text page, or None when it has none of them."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in WAITING + RUNNING + KV_USAGE:
                    found[sample.name] = found.get(sample.name, 0.0) + sample.value
    except ValueError:
        return None
    waiting = next((found[name] for name in WAITING if name in found), None)
    running = next((found[name] for name in RUNNING if name in found), None)
    if waiting is None or running is None:
        return None
    kv = next((found[name] for name in KV_USAGE if name in found), None)
    return waiting, running, kv


class MetricsReader:
    """Reads one deployment's GET /metrics (at the server's root, beside /v1) every METRICS_EVERY_S
    while the engine has calls for it, and hands the figures to its FlowControl."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.task = None
        self.retry_at = 0.0

    def ensure(self):
        """Start reading unless already reading or the server showed it has nothing to read."""
        if self.task is None and time.monotonic() >= self.retry_at and self.upstream.origin is not None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self):
        upstream = self.upstream
        try:
            head = upstream.origin.prepare(
                "/metrics",
                {"Authorization": upstream.headers["Authorization"]} if "Authorization" in upstream.headers else {},
                "GET",
                root=True,
            )
            while upstream.healthy or upstream.in_use:
                figures = await self._read(head)
                if figures is None:
                    self.retry_at = time.monotonic() + METRICS_RETRY_S
                    return
                upstream.flow.metrics(*figures, time.monotonic())
                await asyncio.sleep(METRICS_EVERY_S)
        except (ValueError, TransportError, OSError):
            self.retry_at = time.monotonic() + METRICS_RETRY_S
        finally:
            self.task = None

    async def _read(self, head):
        async with asyncio.timeout(METRICS_TIMEOUT_S):
            response = await self.upstream.origin.post(head, b"")
        if response.status != 200:
            return None
        return read_metrics(response.body.decode("utf-8", "replace"))

    def close(self):
        if self.task is not None:
            self.task.cancel()
