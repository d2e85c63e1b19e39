"""The yardstick applications: streaming jobs written against named sources, run live and as backfills.

Each module has one function that takes the run's `AppRun` (`bergstream.backfill.runtime.app`) and
returns the streaming DataFrame the application writes; `bergstream app run` and `bergstream backfill run`
start it.
"""

from pathlib import Path

# The applications' settings files (deploy/apps/<app>.yaml): an installed bergstream carries them in
# settings/ (setup.py puts them there), a checkout has them at its root. The demo runs from them wherever
# it is started.
_SHIPPED_SETTINGS = Path(__file__).parent / "settings"
SETTINGS_DIR = (
    _SHIPPED_SETTINGS
    if _SHIPPED_SETTINGS.is_dir()
    else Path(__file__).resolve().parents[3] / "deploy" / "apps"
)
