"""``agentgym view``: a local web page to replay trajectories and watch a training run.

:func:`create_app` builds the FastAPI app over a run folder or one trajectory JSONL file;
``docs/viewer.md`` describes the page and its JSON API.
"""

from agentgym.viewer.app import create_app
from agentgym.viewer.index import EpisodeIndex, NotTrajectoryFile

__all__ = ["EpisodeIndex", "NotTrajectoryFile", "create_app"]
