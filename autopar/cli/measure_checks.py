"""``autopar measure``'s one-line errors: flags that contradict a ``--pin``, and a rank's module
that builds but fails in its training step (an error from inside torch, named in one line)."""

from __future__ import annotations

from autopar.core.errors import AutoparError


def check_pin(args) -> None:
    """One-line errors for a ``--pin`` the other flags contradict (before anything is traced)."""
    if not args.pin:
        return
    from autopar.planning.degrees import parse_pin

    pin = parse_pin(args.pin)  # ValueError naming the bad part
    if args.plan:
        raise ValueError("--pin fixes the plan to search, --plan gives one: use one of them")
    if args.hierarchical == "off":
        raise ValueError("--pin needs the hierarchical search (tensor/pipeline/data degrees): drop --hierarchical off")
    if args.cost_model != "analytic":
        raise ValueError(f"--pin prices with the analytic model (the hierarchical search's), not "
                         f"--cost-model {args.cost_model}: drop --cost-model")
    if pin.zero is not None and args.zero != "auto" and int(args.zero) != pin.zero:
        raise ValueError(f"--zero {args.zero} and the pin's zero={pin.zero} disagree: give the ZeRO stage once")
    if pin.recompute is not None and getattr(args, "recompute", "auto") != "auto":
        raise ValueError("--recompute and the pin's recompute= both set recomputation: give it once")


def checked(step):
    """``step`` with torch's errors from inside it (a shape the rank's module does not take, an op
    the fake group cannot run) as one AutoparError line naming the error."""
    def run():
        try:
            step()
        except (RuntimeError, TypeError, NotImplementedError) as e:
            raise AutoparError(f"rank's module fails in its training step on the fake process group: "
                               f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from None

    return run
