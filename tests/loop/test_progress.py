"""Progress inside long phases: every sampled turn shows on the bar before any question ends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from searchr1.data.types import QAExample
from searchr1.loop.evaluate import run_eval
from searchr1.loop.progress import StepProgress, TurnCounter
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever


class Bar:
    """A tqdm stand-in that records each postfix it is given."""

    def __init__(self):
        self.postfixes: list[str] = []

    def set_postfix_str(self, text, refresh=True):
        self.postfixes.append(text)


def test_watched_sampler_counts_turns_and_tokens_and_forwards_the_rest():
    sampler = ScriptedSampler(lambda prompt, i: "S:ab;")
    bar = Bar()
    watched = TurnCounter(bar, "eval: ").watch(sampler)
    engine = RolloutEngine(CharProtocol(), SlowRetriever(0.0), 1, RolloutConfig(max_turns=2))
    ex = QAExample(id="q", question="who", golden_answers=("x",), data_source="t")
    (traj,) = asyncio.run(engine.rollout_group(watched, ex, 1, SamplingSettings(temperature=0.0)))
    assert len(traj.turns) == 2 and watched.calls is sampler.calls  # attributes pass through
    assert bar.postfixes == ["eval: 1 turns, 5 tokens", "eval: 2 turns, 10 tokens"]


def test_eval_bar_shows_turns_while_questions_run(capsys):
    """Before the change the eval bar counted finished questions only (0% for minutes)."""
    script = lambda prompt, i: "S:ab;" if prompt.count("[") < 2 else "A:x;"
    engine = RolloutEngine(CharProtocol(), SlowRetriever(0.0), 1, RolloutConfig(max_turns=4))
    examples = [QAExample(id=f"q{i}", question="who", golden_answers=("x",), data_source="t")
                for i in range(2)]
    asyncio.run(run_eval(ScriptedSampler(script), engine, examples, lambda inp: 0.0,
                         SamplingSettings(temperature=0.0)))
    err = capsys.readouterr().err
    assert "6 turns" in err and "tokens" in err


def test_step_progress_names_the_phase_and_keeps_the_last_steps_figures():
    bar = Bar()
    progress = StepProgress(bar)
    progress.finished({"R": "0.5", "loss": "0.1"})

    async def rollout():  # StepRunner.rollout_phase runs in the event loop
        watched = progress.sampler(ScriptedSampler(lambda p, i: "A:x;"), step=1)
        await watched.sample_async(prompt=_prompt("Q:who|"))
        progress.training()

    asyncio.run(rollout())
    assert bar.postfixes[-2] == "R=0.5 loss=0.1 | step 2 rollout: 1 turns, 4 tokens"
    assert bar.postfixes[-1] == "R=0.5 loss=0.1 | step 2: updating the policy"


def _prompt(text: str):
    import pytrio

    return pytrio.ModelInput.from_ints([ord(c) for c in text])


def test_a_turn_still_decoding_shows_its_tokens_every_tick():
    """The local sampler counts tokens per decode step; the bar reads them while a turn runs."""
    bar = Bar()
    sampler = ScriptedSampler(lambda p, i: "A:x;")
    sampler.stats = SimpleNamespace(tokens=100)  # tokens before this phase are not counted
    sampler.tokens_picked = lambda: sampler.stats.tokens  # engines.base.CountsTokens

    async def phase():
        counter = TurnCounter(bar, "eval: ", sampler)
        ticker = asyncio.get_running_loop().create_task(counter.ticking(0.01))
        sampler.stats.tokens += 7  # the worker thread decoding a turn
        await asyncio.sleep(0.05)
        ticker.cancel()

    asyncio.run(phase())
    assert bar.postfixes and bar.postfixes[-1] == "eval: 0 turns, 7 tokens"


def test_the_hf_sampler_counts_every_token_it_picks(tiny_model_dir):
    from searchr1.engines.local.model import LocalEngineConfig, ModelConfig
    from searchr1.engines.local.service import LocalService

    service = LocalService(LocalEngineConfig(device="cpu"), ModelConfig(
        name="tiny", hf_id=str(tiny_model_dir), gguf_file=None), "/tmp")
    sampler = service.create_sampling_client()
    import pytrio

    params = pytrio.SamplingParams(max_tokens=5, temperature=1.0, seed=1)
    prompt = pytrio.ModelInput.from_ints(service.get_tokenizer().encode("Q: who", add_special_tokens=False))
    out = asyncio.run(sampler.sample_async(prompt=prompt, num_samples=3, sampling_params=params))
    assert sampler.tokens_picked() == sampler.stats.tokens == sum(len(s.tokens) for s in out.sequences) > 0
