"""``engine=trio``: the policy runs on PyTRIO (remote sampling + LoRA training).

``TrioService`` has the surface of ``LocalService`` and hands out pytrio's own
``TrainingClient`` / ``SamplingClient`` objects unwrapped, so the trainer makes exactly the
calls it makes on the local engine and nothing trainer-side branches on the engine.

Credentials never pass through our config. pytrio resolves the API key itself, in this
order: ``PYTRIO_API_KEY``; else the ``api_key`` of the active profile (``~/.pytrio/
config.toml`` for the default profile, ``~/.pytrio/envs/<name>/config.toml`` for the one
named by ``PYTRIO_ENV`` or by ``~/.pytrio/env.toml``), written by ``trio login``; pytrio
reads the variables and files once, when it is imported. ``check_credentials`` repeats that resolution offline, with pytrio's own readers, so
``preflight`` can report a missing login before anything is loaded.

Settings. pytrio reads its connection settings (base URL, timeouts, retry windows) from a
process-wide ``Configuration`` that ``ServiceClient`` copies when it is built; the few we
expose are applied for the construction only and restored after it, so building a service
leaves the process-wide pytrio state as it found it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from searchr1.engines.base import EngineCapabilities
from searchr1.startup.errors import StartupError
from searchr1.utils.lazy import lazy

# pytrio is imported on first use (≈ 1.7 s): composing a config must not pay for it
pytrio = lazy("pytrio")
_config = lazy("pytrio.config.config")
_environment = lazy("pytrio.config.environment")
_repository = lazy("pytrio.config.repository")
_errors = lazy("pytrio.errors.base")
_control_errors = lazy("pytrio.errors.control")

log = logging.getLogger(__name__)

TRIO_SCHEME = "trio://"
LOGIN_HINT = "run `trio login` (it saves the key under ~/.pytrio) or set PYTRIO_API_KEY"
_RELOGIN_CODES = {"unauthorized", "forbidden", "api_key_expired", "api_key_revoked",
                  "api_key_disabled"}


@dataclass
class TrioEngineConfig:
    """Schema of ``engine=trio``. No key field: keys come only from pytrio (see module doc)."""

    # engine name in the registry
    name: str = "trio"
    # where models this process loads itself are cached (the PPO critic, a local value model)
    cache_dir: str = "~/.cache/searchr1"
    # PyTRIO service URL; null = pytrio's own (PYTRIO_BASE_URL, the profile, pytrio.com)
    base_url: str | None = None
    # per-request HTTP timeout in seconds; null = pytrio's (30)
    request_timeout_seconds: int | None = None
    # how long control calls (login, run creation) retry after a failure; null = pytrio's (900)
    control_retry_timeout_seconds: float | None = None
    # how long training calls retry after a failure; null = pytrio's (900)
    training_retry_timeout_seconds: float | None = None
    # how long sampling calls retry after a failure; null = pytrio's (900)
    sampling_retry_timeout_seconds: float | None = None
    # cap on one sampling request in seconds; null = pytrio's (14400)
    sampling_timeout_seconds: int | None = None
    # how long run creation waits for free GPUs; null = pytrio's (3600)
    actor_capacity_wait_timeout_seconds: float | None = None
    # pytrio's console log level: DEBUG | INFO | WARNING | ERROR; null = pytrio's (INFO)
    log_level: str | None = None
    # the served model's context limit (prompt + generation), when known; only the start-up
    # check reads it (searchr1/startup/checks.py), the service enforces its own
    max_seq_len: int | None = None
    # send pytrio's SDK telemetry; null = pytrio's default (on)
    telemetry: bool | None = None


#: TrioEngineConfig fields that are pytrio ``Configuration`` fields of the same name.
_SETTINGS = (
    "base_url", "request_timeout_seconds", "control_retry_timeout_seconds",
    "training_retry_timeout_seconds", "sampling_retry_timeout_seconds",
    "sampling_timeout_seconds", "actor_capacity_wait_timeout_seconds", "log_level",
)


class TrioEngineError(StartupError):
    """PyTRIO could not be reached or refused us; the message says what to do.

    A ``StartupError`` (exit code 2 with the message, not a traceback): the run cannot
    start. The pytrio error is folded into the message and not chained.
    """


# ----------------------------------------------------------------------------- credentials


def check_credentials(cfg: TrioEngineConfig | None = None) -> list[str]:
    """Why pytrio would find no usable API key, without network; empty when it would.

    Mirrors pytrio's import-time resolution (``load_login_config`` then the environment
    overrides) with pytrio's own readers, against ``$HOME/.pytrio`` as it is now. ``cfg``
    is taken for preflight's uniform call; no engine setting changes where keys come from.
    """
    try:
        env = _environment.read_environment_configuration()
    except ValueError as err:
        return [f"engine=trio: invalid PyTRIO environment variable: {err}"]
    repo = _repository.ConfigRepository(Path.home() / ".pytrio")
    try:
        profile_name = _active_profile(repo, env.env)
        profile = repo.inspect_profile(profile_name) if repo.profile_exists(profile_name) else None
    except _errors.PyTrioError as err:  # an unreadable config file or an invalid profile name
        return [f"engine=trio: PyTRIO configuration: {err.message}; fix it, then {LOGIN_HINT}"]
    except ValueError as err:
        return [f"engine=trio: {err}"]
    if env.api_key or (profile is not None and profile.has_credentials):
        return []
    where = f"profile {profile_name!r}" if profile_name else "the default PyTRIO profile"
    return [f"engine=trio: no PyTRIO API key ({where} is not logged in): {LOGIN_HINT}"]


def _active_profile(repo: ConfigRepository, env_override: str | None) -> str:
    """The profile pytrio loads: ``PYTRIO_ENV``, else ``env.toml``'s, else the default ("")."""
    if env_override is not None:
        name = _config.normalize_env_name(env_override)
        if name and not repo.profile_exists(name):
            raise ValueError(f"PYTRIO_ENV={env_override} names a PyTRIO profile that does not "
                             f"exist; create it with `trio env use {name}` or unset PYTRIO_ENV")
        return name
    state = repo.load_environment_state()
    return state.active_env if state is not None else ""


# ---------------------------------------------------------------------------- connection


@contextmanager
def pytrio_settings(cfg: TrioEngineConfig) -> Iterator[None]:
    """Apply ``cfg``'s non-null settings to pytrio for the block, then restore them."""
    changed = {k: getattr(cfg, k) for k in _SETTINGS if getattr(cfg, k) is not None}
    saved = {k: getattr(_config.configuration, k) for k in changed}
    telemetry_was = _telemetry_enabled()
    try:
        pytrio.configure(**changed)  # validates and normalises (e.g. base_url's /api suffix)
        if cfg.telemetry is not None:
            pytrio.configure_observability(enabled=cfg.telemetry)
        yield
    finally:
        for key, value in saved.items():
            setattr(_config.configuration, key, value)
        if cfg.telemetry is not None:
            pytrio.configure_observability(enabled=telemetry_was)


def _telemetry_enabled() -> bool:
    """pytrio's current telemetry switch (it has a setter but no getter in 0.2.9)."""
    from pytrio.observability import api

    return bool(getattr(api, "_enabled", True))


def connect(cfg: TrioEngineConfig) -> pytrio.ServiceClient:
    """A logged-in ``ServiceClient``; any pytrio failure becomes one ``TrioEngineError``."""
    with pytrio_settings(cfg):
        url = _config.configuration.base_url
        try:
            return pytrio.ServiceClient()
        except _errors.PyTrioError as err:
            raise TrioEngineError(explain(err, url)) from None


def explain(err: PyTrioError, base_url: str) -> str:
    """One message for a failed ``ServiceClient()``: what happened and what to do."""
    if err.code == "auth.missing_api_key":
        return f"engine=trio: no PyTRIO API key: {LOGIN_HINT}"
    if err.code in _RELOGIN_CODES or err.status_code in (401, 403):
        return (f"engine=trio: PyTRIO at {base_url} rejected the API key ({err.message}); "
                f"{LOGIN_HINT} with a valid key")
    if isinstance(err, _control_errors.SDKCompatibilityError):
        version = _config.configuration.version
        return f"engine=trio: PyTRIO refuses pytrio {version}: {err.message} {err.hint}".rstrip()
    if err.code.startswith(("auth.", "configuration.")):
        return f"engine=trio: PyTRIO login configuration problem: {err.message}; {LOGIN_HINT}"
    reach = "cannot reach" if err.retryable else "could not start a session with"
    return (f"engine=trio: {reach} PyTRIO at {base_url}: {err.message}. Check the network "
            f"and engine.base_url / PYTRIO_BASE_URL")


# ------------------------------------------------------------------------------- service


class TrioService:
    """PyTRIO behind the ``LocalService`` surface (``searchr1.engines`` docstring).

    One ``ServiceClient`` (one remote service session) per service. The base-model
    sampler is created once and reused (each creation is a remote sampling run).
    """

    def __init__(self, engine_cfg: TrioEngineConfig, model_cfg, run_dir, trainer_cfg) -> None:
        self.engine_cfg = engine_cfg
        self.model_cfg = model_cfg
        self.run_dir = Path(run_dir)
        self.trainer_cfg = trainer_cfg
        _check_model(model_cfg)
        self.client = connect(engine_cfg)
        log.info("PyTRIO session %s (workspace %s)", self.client.service_session_cuid,
                 self.client.workspace_name)
        self.training: pytrio.TrainingClient | None = None
        self._base_sampler: pytrio.SamplingClient | None = None
        self._tokenizer = None

    def get_tokenizer(self):
        """pytrio's tokenizer, from the training client or else the base-model sampler.

        The lab's way (``training_client.get_tokenizer()``): pytrio loads the tokenizer of
        the model id Control resolved, through ModelScope (or a local cache, else
        transformers), so ``engine=trio`` needs no Hugging Face hub access. Before any
        training client exists (the protocol is built first) the base-model sampler is
        opened for it; it is the one ``create_sampling_client()`` returns later, not a
        second run. Loaded once. ``model.chat_template``, when set, replaces the template,
        as on the local engine.
        """
        if self._tokenizer is None:
            source = self.training if self.training is not None else self.create_sampling_client()
            tok = source.get_tokenizer()
            if getattr(self.model_cfg, "chat_template", None) is not None:
                tok.chat_template = self.model_cfg.chat_template
            self._tokenizer = tok
        return self._tokenizer

    def create_sampling_client(self, model_path: str | None = None) -> pytrio.SamplingClient:
        """The base model's sampler when ``model_path`` is None, else saved sampler weights.

        ``model_path`` is a ``trio://`` URI from ``save_weights_for_sampler`` (eval of a
        checkpoint); a local path has no meaning to PyTRIO and is refused here.
        """
        if model_path is None:
            if self._base_sampler is None:
                self._base_sampler = self.client.create_sampling_client(
                    base_model=self.model_cfg.hf_id)
            return self._base_sampler
        if not str(model_path).startswith(TRIO_SCHEME):
            raise ValueError(f"engine=trio samples saved weights by {TRIO_SCHEME} URI "
                             f"(from save_weights_for_sampler), not {model_path!r}")
        return self.client.create_sampling_client(base_model=self.model_cfg.hf_id,
                                                  model_path=model_path)

    def create_lora_training_client(self, rank: int, seed: int, base_model: str | None = None):
        """A fresh LoRA run on ``base_model`` (default ``model.hf_id``); pytrio checks the rank."""
        self.training = TrioTrainingClient(self.client.create_lora_training_client(
            base_model=base_model or self.model_cfg.hf_id, rank=rank, seed=seed))
        return self.training

    def create_training_client_from_state_with_optimizer(self, path: str):
        """Resume: a new LoRA run initialised from ``save_state``'s weights and optimizer."""
        self.training = TrioTrainingClient(self.client.create_training_client_from_state_with_optimizer(path))
        return self.training

    def close(self) -> None:
        """End the remote service session now instead of at interpreter exit.

        pytrio 0.2.9 has no public close: its runtime's ``shutdown`` (idempotent) is what
        its own finalizer calls.
        """
        runtime = getattr(self.client, "_runtime", None)
        if runtime is not None:
            runtime.shutdown()


class TrioTrainingClient:
    """pytrio's ``TrainingClient`` with the capabilities record the loop reads (``engines/base.py``):
    remote calls that queue (submitted before earlier results are awaited), the KL reference's
    log-probs from the base model's sampler, a reference that stays the base model. Every call
    goes to pytrio's client unchanged."""

    capabilities = EngineCapabilities(pipelined=True)

    def __init__(self, inner: pytrio.TrainingClient) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _check_model(model_cfg) -> None:
    """Refuse models PyTRIO cannot serve (the embedded GGUF default) before connecting."""
    if str(model_cfg.hf_id).startswith("embedded:") or getattr(model_cfg, "gguf_file", None):
        raise TrioEngineError(
            f"engine=trio: model {model_cfg.name!r} ({model_cfg.hf_id}) is a local GGUF model; "
            "PyTRIO serves hub models from its catalog: choose one, e.g. model=qwen3_5_4b")
