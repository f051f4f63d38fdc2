"""The step plugin's pure parts (plugins/vllm): messages from scheduler stand-ins, channels, the guard."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from attrib_vllm_plugin import channel, steps
from attrib_vllm_plugin.hook import StepExporter, install


class Queue(list):
    def peek_request(self):
        return self[0]


class Req(SimpleNamespace):
    __hash__ = object.__hash__  # vLLM's Request is hashable by identity (deferred_waiting is a set of them)


def req(rid, computed, tokens, preemptions=0):
    return Req(request_id=rid, num_computed_tokens=computed, num_tokens=tokens,
                           num_preemptions=preemptions)


def scheduler(running, waiting, holdings, free, **kw):
    manager = SimpleNamespace(req_to_blocks={rid: [object()] * n for rid, n in holdings.items()})
    pool = SimpleNamespace(get_num_free_blocks=lambda: free, num_gpu_blocks=96)
    kv = SimpleNamespace(coordinator=SimpleNamespace(single_type_managers=[manager]), block_pool=pool)
    everyone = {r.request_id: r for r in [*running, *waiting]}
    base = dict(kv_cache_manager=kv, block_size=128, running=list(running), waiting=Queue(waiting),
                kv_holding_waiting=Queue(), requests=everyone, current_step=7, max_num_running_reqs=256,
                max_num_scheduled_tokens=2048, deferred_waiting=set())
    return SimpleNamespace(**{**base, **kw})


def output(scheduled, new=(), resumed=(), preempted=(), finished=()):
    cached = [rid for rid in scheduled if rid not in {n[0] for n in new}]
    return SimpleNamespace(
        num_scheduled_tokens=dict(scheduled), total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=hit) for r, hit in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=cached, resumed_req_ids=set(resumed),
                                              num_computed_tokens=[0] * len(cached)),
        preempted_req_ids=set(preempted), finished_req_ids=set(finished))


def test_external_id_strips_only_vllms_8_hex_suffix():
    assert steps.external_id("cmpl-a11e94-s003-0-1f2e3d4c") == "cmpl-a11e94-s003-0"
    assert steps.external_id("chatcmpl-abc") == "chatcmpl-abc"
    assert steps.external_id("cmpl-x-0-XYZ12345") == "cmpl-x-0-XYZ12345"


@pytest.mark.parametrize("kw,reason", [
    ({"paused": True, "preempted": True}, steps.PAUSED),
    ({"preempted": True, "running": 256}, steps.PREEMPTION),
    ({"running": 256, "scheduled_tokens": 2048}, steps.MAX_SEQS),
    ({"scheduled_tokens": 2048, "need_blocks": 99}, steps.TOKEN_BUDGET),
    ({"need_blocks": 31}, steps.NO_FREE_BLOCKS),
    ({"deferred": True}, steps.DEFERRED),
    ({}, steps.OTHER),
])
def test_waiting_reason_follows_vllms_order_of_checks(kw, reason):
    base = dict(paused=False, preempted=False, running=3, max_seqs=256, scheduled_tokens=100, token_budget=2048,
                need_blocks=30, free_blocks=30, deferred=False)
    assert steps.waiting_reason(**{**base, **kw}) == reason


def test_iterations_count_only_steps_that_scheduled_tokens():
    c = steps.StepCounter()
    assert [c.take(n) for n in (5, 0, 1, 0, 9)] == [0, None, 1, None, 2]


def test_step_record_names_members_blocks_admissions_and_the_blocked_head():
    whale = req("cmpl-w-0-0000000a", 2048 + 256, 5600)
    short = req("cmpl-s-0-0000000b", 32, 33)
    back = req("cmpl-v-0-0000000c", 1596, 4100, preemptions=1)
    head = req("cmpl-h-0-0000000d", 0, 4000)
    sched = scheduler([whale, short, back], [head], {whale.request_id: 20, short.request_id: 1,
                                                     back.request_id: 32}, free=10)
    out = output({whale.request_id: 256, short.request_id: 32, back.request_id: 1500},
                 new=[(short.request_id, 0), (back.request_id, 96)], finished={"cmpl-f-0-0000000e"})
    rec = steps.step_record(sched, out, iteration=41, drops=2, now=100.0)
    assert rec["v"] == 1 and rec["kind"] == "step" and rec["step"] == 7 and rec["iter"] == 41
    assert rec["scheduled"] == [{"id": whale.request_id, "new": 256, "done": 2048},
                                {"id": short.request_id, "new": 32, "done": 0, "hit": 0},
                                {"id": back.request_id, "new": 1500, "done": 96, "hit": 96}]
    assert rec["admitted"] == [short.request_id] and rec["resumed"] == [back.request_id]
    assert rec["blocks"] == {whale.request_id: 20, short.request_id: 1, back.request_id: 32}
    assert rec["head"] == {"id": head.request_id, "reason": steps.NO_FREE_BLOCKS, "tokens": 4000,
                           "need_blocks": 32, "preemptions": 0}
    assert rec["finished"] == ["cmpl-f-0-0000000e"] and rec["drops"] == 2 and rec["tokens"] == 1788
    json.dumps(rec)  # plain JSON: ids and counts only


def test_no_head_when_nobody_waits_and_preemptions_are_listed():
    a = req("cmpl-a-0-00000001", 10, 10)
    sched = scheduler([a], [], {a.request_id: 1}, free=90)
    rec = steps.step_record(sched, output({a.request_id: 1}, preempted={"cmpl-b-0-00000002"}), 0, 0)
    assert rec["head"] is None and rec["preempted"] == ["cmpl-b-0-00000002"]


def test_datagrams_nobody_hears_are_dropped_and_counted(tmp_path):
    ch = channel.DatagramChannel(str(tmp_path / "nobody.sock"))
    assert ch.send(b"x\n") is False and ch.dropped == 1 and ch.sent == 0


def test_datagrams_reach_a_listener_and_a_full_buffer_drops_without_blocking(tmp_path):
    path = str(tmp_path / "s.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    ch = channel.DatagramChannel(path)
    assert ch.send(channel.encode({"v": 1})) is True
    assert json.loads(rx.recv(1000)) == {"v": 1}
    for _ in range(10_000):  # nobody reads: the socket's buffer fills and sends start to drop
        ch.send(b"y" * 1000)
    assert ch.dropped > 0 and ch.sent > 1
    assert ch.send(b"z" * (channel.MAX_DATAGRAM + 1)) is False
    rx.close()


def test_a_slow_receiver_loses_nothing_within_the_wait_and_a_restarted_one_is_found_again(tmp_path):
    path = str(tmp_path / "s.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    ch = channel.DatagramChannel(path, wait_s=5.0)
    sender = threading.Thread(target=lambda: [ch.send(b"%d" % i) for i in range(100)])
    sender.start()  # far more than the kernel queues for one receiver (max_dgram_qlen, often 10)
    time.sleep(0.2)
    got = [int(rx.recv(100)) for _ in range(100)]
    sender.join()
    assert got == list(range(100)) and ch.dropped == 0
    rx.close()
    os.unlink(path)
    assert ch.send(b"x") is False  # the receiver is gone: dropped
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    assert ch.send(b"y") is True and rx.recv(10) == b"y"
    rx.close()


def test_fanout_is_off_without_settings_and_writes_a_file(tmp_path):
    assert channel.Fanout.from_env({}) is None
    path = tmp_path / "steps.ndjson"
    out = channel.Fanout.from_env({channel.ENV_FILE: str(path), channel.ENV_SOCKET: str(tmp_path / "none.sock")})
    out.send({"v": 1, "kind": "step"})
    out.close()
    assert json.loads(path.read_text()) == {"v": 1, "kind": "step"} and out.dropped == 1


def test_send_wait_comes_from_the_environment_and_bad_values_keep_the_default(tmp_path):
    """The lab's truth recorder asks for a longer wait (it must miss no step); a bad value never breaks vLLM."""
    sock = str(tmp_path / "s.sock")
    for raw, want in [("5", 5.0), ("0.5", 0.5), ("x", channel.SEND_WAIT_S), ("0", channel.SEND_WAIT_S),
                      ("-1", channel.SEND_WAIT_S), ("1e9", channel.SEND_WAIT_S), (None, channel.SEND_WAIT_S)]:
        env = {channel.ENV_SOCKET: sock, **({channel.ENV_SEND_WAIT: raw} if raw is not None else {})}
        out = channel.Fanout.from_env(env)
        assert out is not None and out.channels[0].wait_s == want, raw


class FakeScheduler:
    def __init__(self, sched):
        self.__dict__.update(vars(sched))

    def schedule(self, n=1):
        return self._out


def test_hook_sends_hello_then_steps_and_an_error_turns_it_off_for_good(tmp_path, monkeypatch):
    # the plugin logs under vLLM's "vllm" logger, whose handlers and propagation vLLM's own logging config
    # replaces once any earlier test imports vllm: record the plugin's warnings at the logger itself
    from attrib_vllm_plugin import hook

    warned: list[str] = []
    monkeypatch.setattr(hook.logger, "warning", lambda msg, *args: warned.append(msg % args))
    _hook_sends_hello_then_steps(tmp_path, warned)


def _hook_sends_hello_then_steps(tmp_path, warned):
    path = tmp_path / "steps.ndjson"
    out = channel.Fanout.from_env({channel.ENV_FILE: str(path)})
    cls = type("Sched", (FakeScheduler,), {})
    exporter = StepExporter(out)
    assert install(exporter, cls) and not install(exporter, cls)  # once only
    a = req("cmpl-a-0-00000001", 10, 10)
    s = cls(scheduler([a], [], {a.request_id: 1}, free=90))
    s._out = output({a.request_id: 1})
    assert s.schedule() is s._out
    exporter.flush()
    s._out = None  # a vLLM whose output lacks what we read
    assert s.schedule() is None  # the engine still gets its output
    assert not exporter.enabled and any("disabled" in w for w in warned)
    s._out = output({a.request_id: 1})
    s.schedule()
    kinds = [json.loads(x)["kind"] for x in path.read_text().splitlines()]
    assert kinds == ["hello", "step"]


def test_a_full_queue_drops_and_counts_instead_of_waiting(tmp_path):
    out = channel.Fanout.from_env({channel.ENV_FILE: str(tmp_path / "steps.ndjson")})
    exporter = StepExporter(out, queue_size=1)
    exporter._thread = object()  # no sender: the queue stays full
    a = req("cmpl-a-0-00000001", 10, 10)
    s = scheduler([a], [], {a.request_id: 1}, free=90)
    for _ in range(3):
        exporter.after_schedule(s, output({a.request_id: 1}))
    assert exporter.enabled and exporter.queued_drops == 3 and exporter.dropped == 3  # hello kept, 3 steps lost


def test_register_is_inert_without_settings():
    """Installed but not configured: vLLM calls register() in every process, and it must not even import vLLM."""
    env = {k: v for k, v in os.environ.items() if k not in (channel.ENV_SOCKET, channel.ENV_FILE)}
    code = ("import sys, attrib_vllm_plugin; attrib_vllm_plugin.register(); "
            "print(sorted(m for m in sys.modules if m.startswith('vllm')))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done
