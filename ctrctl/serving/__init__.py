"""The online ranker: ``ctrctl serve`` (FastAPI + uvicorn), its batcher, models and metrics.

Example:
    >>> from ctrctl.serving import ServeConfig, serve
    >>> serve(ServeConfig(model="export", port=8080))
"""

from ctrctl.serving.config import ServeConfig
from ctrctl.serving.server import check_models, serve

__all__ = ["ServeConfig", "check_models", "serve"]
