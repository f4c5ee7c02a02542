"""autopar.core.progress: silent off a terminal, a bar and a summary line on one, rate-limited redraws."""

import io

import pytest

import autopar
from autopar.core.progress import Progress, fmt_duration, phase


class Clock:
    """A hand-driven clock: the tests never depend on how fast the machine is."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_nothing_is_written_to_a_stream_that_is_not_a_terminal():
    out = io.StringIO()  # isatty() is False
    bar = Progress(5, "profiling", stream=out)
    for k in range(5):
        bar.step(f"node{k}")
    bar.close()
    with phase("tracing GPT", stream=out):
        pass
    assert out.getvalue() == ""
    assert bar.summary.startswith("profiling: done in")  # the summary exists, it is just not shown


def test_a_terminal_is_detected_by_default():
    tty = Tty()
    bar = Progress(2, "search", stream=tty)
    bar.update()
    bar.update()
    assert "2/2" in tty.getvalue() and tty.getvalue().endswith("\n")


def test_enabled_writes_bar_then_one_final_summary_line():
    clock = Clock()
    out = io.StringIO()
    bar = Progress(4, "profiling gpt", stream=out, enabled=True, clock=clock, min_interval=0.0)
    for k in range(4):
        clock.t += 0.5
        bar.step(f"n{k}")
    text = out.getvalue()
    assert "1/4" in text and "4/4" in text and "n3" in text
    assert text.endswith("\n") and text.count("\n") == 1  # the bar redraws in place; one line at the end
    final = text.rsplit("\r", 1)[-1].rstrip()
    assert final == "profiling gpt: done in 2.0 s"
    assert bar.closed and bar.summary == final


def test_redraws_are_rate_limited_but_the_last_step_is_always_drawn():
    clock = Clock()
    out = io.StringIO()
    bar = Progress(1000, "x", stream=out, enabled=True, clock=clock, min_interval=0.1)
    for _ in range(999):
        clock.t += 0.001  # 1000 steps in 1 s: about 10 redraws, not 1000
        bar.update()
    draws = out.getvalue().count("\r")
    assert 5 <= draws <= 12, draws
    assert "999/1000" not in out.getvalue()  # too soon after the previous draw
    bar.update()
    assert "1000/1000" in out.getvalue() and out.getvalue().endswith("\n")


def test_closing_early_says_where_it_stopped_and_close_is_idempotent():
    clock = Clock()
    out = io.StringIO()
    with Progress(10, "search", stream=out, enabled=True, clock=clock) as bar:
        bar.update(3)
        clock.t += 4.0
    bar.close()
    bar.update(5)  # after close: ignored
    assert out.getvalue().count("\n") == 1
    assert out.getvalue().rsplit("\r", 1)[-1].rstrip() == "search: stopped at 3/10 after 4.0 s"


def test_a_shorter_line_blanks_what_a_longer_one_left():
    out = io.StringIO()
    bar = Progress(2, "p", stream=out, enabled=True, min_interval=0.0)
    bar.step("a-very-long-node-name-indeed")
    bar.step()
    first, summary = out.getvalue().split("\r")[1:3]
    assert len(summary.rstrip("\n")) >= len(first)


def test_empty_work_and_disabled_bars_write_nothing():
    out = io.StringIO()
    Progress(0, "nothing", stream=out, enabled=True).close()
    Progress(3, "off", stream=Tty(), enabled=False).step()
    assert out.getvalue() == ""


def test_phase_completes_its_line_with_the_time_taken():
    clock = Clock()
    out = io.StringIO()
    with phase("tracing GPT", stream=out, enabled=True, clock=clock) as p:
        assert out.getvalue() == "tracing GPT ..."
        clock.t += 1.3
    assert p.seconds == pytest.approx(1.3) and not p.failed
    assert out.getvalue().endswith("\n") and out.getvalue().rsplit("\r", 1)[-1] == "tracing GPT ... 1.3 s\n"


def test_phase_reports_a_failure_and_lets_the_exception_through():
    clock = Clock()
    out = io.StringIO()
    with pytest.raises(KeyError):
        with phase("search", stream=out, enabled=True, clock=clock) as p:
            clock.t += 3.0
            raise KeyError("x")
    assert p.failed
    assert out.getvalue().rsplit("\r", 1)[-1] == "search ... failed after 3.0 s\n"


def test_a_closed_stream_does_not_break_the_work():
    out = io.StringIO()
    bar = Progress(2, "p", stream=out, enabled=True)
    out.close()
    bar.step()
    bar.step()
    assert bar.closed


@pytest.mark.parametrize("s,text", [(0.04, "0.0 s"), (12.34, "12.3 s"), (185, "3 min 05 s"),
                                    (3725, "1 h 02 min")])
def test_durations(s, text):
    assert fmt_duration(s) == text


def test_trace_shows_a_phase_only_when_asked():
    model, inputs = autopar.zoo.get("mlp", layers=2)
    quiet = io.StringIO()
    g1 = autopar.trace(model, inputs, progress=quiet)  # a stream that is no terminal: nothing
    assert quiet.getvalue() == ""
    loud = Tty()
    g2 = autopar.trace(model, inputs, progress=loud)
    name = type(model).__name__
    assert loud.getvalue().startswith(f"tracing {name} ...") and loud.getvalue().endswith(" s\n")
    assert [n.name for n in g1.nodes] == [n.name for n in g2.nodes]
