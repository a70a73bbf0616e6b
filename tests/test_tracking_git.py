"""The commit tag of tracked runs: present in a git checkout, absent (and no failure) in a
source archive or a copied tree, where the test that needs a commit is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl import tracking
from ctrctl.tracking import MlflowTracker, git_commit

COMMIT = git_commit()
needs_git_checkout = pytest.mark.skipif(
    COMMIT is None, reason="not a git checkout (a source archive or a copied tree)")


@needs_git_checkout
def test_runs_carry_the_commit_of_the_checkout(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # MLflow's own lookup finds no repository here
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with MlflowTracker(tracking_uri=uri, experiment="git").run("step") as run:
        pass
    tags = MlflowClient(tracking_uri=uri).get_run(run.run_id).data.tags
    assert tags["mlflow.source.git.commit"] == COMMIT and len(COMMIT) == 40


def test_outside_a_checkout_runs_have_no_commit_tag(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tracking, "git_commit", lambda: None)
    tags = tracking._context_tags()
    assert "mlflow.source.git.commit" not in tags

