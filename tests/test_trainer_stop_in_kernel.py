"""The dashboard's stop button and Kernel > Interrupt, in a real kernel.

A notebook cell that trains holds the kernel: a click in the browser is a comm message
the kernel reads only while the cell waits. The training loop of lesson 13 awaits
`dashboard.keep_going()` once a step; this test starts an IPython kernel, runs such a
loop in it, sends the click the browser would send (the button's comm message), and
checks that the loop ended there, cleanly, with "stopped by you at step N". Then the
same with an interrupt, as Kernel > Interrupt sends it: no traceback, the same line.
"""
from __future__ import annotations

import time

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

SETUP = """
from widgets.trainer import TrainerDashboard
dash = TrainerDashboard(total_steps=100000, redraw_every=10**9)
print(dash.stop_button.model_id)
"""
LOOP = """
import time
with dash.running():
    for step in range(1, 100001):
        if not await dash.keep_going():
            break
        time.sleep(0.005)
        dash({"step": step, "loss": 1.0})
print(dash.progress_line(done=True))
"""


@pytest.fixture()
def kernel():
    from pathlib import Path
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(Path(__file__).resolve().parents[1]))
    client = km.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    yield km, client
    client.stop_channels()
    km.shutdown_kernel(now=True)


def setup_dashboard(client) -> str:
    """Make the dashboard in the kernel; the stop button's comm id."""
    messages = []
    client.execute_interactive(SETUP, timeout=60, output_hook=messages.append)
    return _stdout_and_errors(messages)[0].strip()


def _stdout_and_errors(messages):
    text = "".join(m["content"].get("text", "") for m in messages
                   if m["msg_type"] == "stream")
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    return text, errors


def _start_loop(client):
    msg_id = client.execute(LOOP)
    time.sleep(2.0)                       # a few hundred steps run
    return msg_id


def _finish(client, msg_id, timeout=30):
    messages, deadline = [], time.time() + timeout
    while time.time() < deadline:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return _stdout_and_errors(messages)
    pytest.fail("the loop did not stop")


def test_a_click_on_stop_ends_the_loop_while_the_cell_runs(kernel):
    km, client = kernel
    model_id = setup_dashboard(client)
    msg_id = _start_loop(client)
    click = client.session.msg("comm_msg", {"comm_id": model_id, "data": {
        "method": "custom", "content": {"event": "click"}}})
    client.shell_channel.send(click)
    text, errors = _finish(client, msg_id)
    assert not errors, errors
    assert "stopped early at step" in text and "stopped by you at step" in text
    step = int(text.rsplit("stopped by you at step ", 1)[1].split()[0])
    assert 0 < step < 100000


def test_kernel_interrupt_is_caught_into_one_line(kernel):
    km, client = kernel
    setup_dashboard(client)
    msg_id = _start_loop(client)
    km.interrupt_kernel()
    text, errors = _finish(client, msg_id)
    assert not errors, errors
    assert "stopped by you at step" in text
