"""Exit 2, not 1, when Hydra cannot compose the config, so a sweep tells config errors from
crashes.

Hydra reports every failure the same way: its message (``Could not override
'retriever.topkk'. … Key 'topkk' not in 'BM25Config'``), then exit 1, whether the override
was misspelt or the job crashed. ``run_main`` runs a ``@hydra.main`` function and turns that
exit 1 into 2 (the code of every bad input, ``StartupError``) when the exception behind it is
a config error: a composition error (an unknown key, option or group, a value of the wrong
type), an override that does not parse, a bad search path, an interpolation that cannot be
resolved or a mandatory value left unset. Hydra's own text is printed as before; a crash
keeps exit 1.

Hydra exits from inside its ``except`` block, so the exception is the ``SystemExit``'s
``__context__``; with ``HYDRA_FULL_ERROR=1`` it propagates itself (its traceback is printed
here, as Python would).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from hydra.errors import ConfigCompositionException, OverrideParseException, SearchPathException
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

EXIT_CONFIG = 2  # StartupError's code: the run cannot start as configured
CONFIG_ERRORS = (ConfigCompositionException, OverrideParseException, SearchPathException,
                 InterpolationResolutionError, MissingMandatoryValue)


def is_config_error(err: BaseException | None) -> bool:
    """Whether ``err`` says the config (not the code) is wrong."""
    return isinstance(err, CONFIG_ERRORS)


def run_main(main: Callable[[], object]) -> None:
    """``main()`` (a ``@hydra.main`` function), exiting 2 on a config error instead of 1."""
    try:
        main()
    except SystemExit as done:
        if done.code == 1 and is_config_error(done.__context__):
            raise SystemExit(EXIT_CONFIG) from None
        raise
    except Exception as err:  # HYDRA_FULL_ERROR=1: Hydra re-raises instead of exiting 1
        if not is_config_error(err):
            raise
        traceback.print_exc()
        raise SystemExit(EXIT_CONFIG) from None
