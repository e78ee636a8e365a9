"""``python -m petra_core.engine.distributed``: the demo (see demo.py)."""
import sys

from .demo import main

sys.exit(main())
