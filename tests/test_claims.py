"""Results v2's goals judged from a benchmark table's rows (drafters.eval.claims)."""

from drafters.eval.claims import goal_lines


def test_goals_are_judged_on_lossless_methods_and_say_by_how_much():
    def row(m, tau, speedup, lossless=True):
        return {"method": m, "tau": tau, "speedup": speedup, "lossless": lossless}

    rows = [row("hf_greedy", None, 1.0), row("hf_prompt_lookup", None, 1.25),
            row("medusa", 1.5, 2.0), row("cerberus", 1.5, 2.1),
            row("falcon_k2_tf", 1.6, 1.9), row("falcon_k2", 1.5, 1.7),
            row("falcon_k3", 3.5, 2.6, lossless=False),
            row("falcon_k2+hybrid", 2.5, 2.4)]  # fmt: skip
    drafters = ["medusa", "cerberus", "falcon_k2_tf", "falcon_k2", "falcon_k3", "falcon_k2+hybrid"]
    lines = goal_lines(rows, drafters)
    body = {ln.split(" | ")[0][2:]: ln.split(" | ")[1:] for ln in lines if ln.startswith("| ")}
    # the lossy k=3 is never the best Falcon, nor the best drafter; the hybrid tree (n-gram
    # candidates) is never the best Falcon, and is the best drafter only where n-grams may count
    assert body["Falcon τ"] == ["1.60", "falcon_k2_tf", "3.0", "missed by 47% |"]
    assert body["Falcon speedup over HF greedy"] == ["1.90", "falcon_k2_tf", "1.6", "met |"]
    assert body["best drafter over HF prompt lookup"][:2] == [
        "1.92", "falcon_k2+hybrid / hf_prompt_lookup"]  # fmt: skip
    assert body["best drafter without n-gram candidates over HF prompt lookup"][:2] == [
        "1.68", "cerberus / hf_prompt_lookup"]  # fmt: skip
    assert body["Cerberus heads over Medusa heads, no gate"][0] == "1.05"
    assert body["Cerberus heads over Medusa heads, no gate"][-1] == "missed by 5% |"
    assert body["decode-faithful CSGD τ over teacher forcing"][-1] == "missed by 15% |"
    assert lines[-1] == "Not lossless on every turn, so left out of the best-of goals: falcon_k3."
    missing = goal_lines([row("hf_greedy", None, 1.0)], drafters)
    assert all(ln.endswith("cannot be judged |") for ln in missing[2:])
