"""Generated git histories for the tests that read real repositories: a trunk with
merges, a path changed and changed back, a force-push (rewrite) and a rollback."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "gen",
    "GIT_AUTHOR_EMAIL": "gen@example.invalid",
    "GIT_COMMITTER_NAME": "gen",
    "GIT_COMMITTER_EMAIL": "gen@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


@dataclass
class Repo:
    path: Path
    #: Every trunk head in the order trunk took it (a rewrite's tip, a rollback's target
    #: included), as full commit ids.
    heads: list[str] = field(default_factory=list)
    tick: int = 0

    def git(self, *args: str) -> str:
        self.tick += 1
        env = {**ENV, "GIT_COMMITTER_DATE": f"{1_700_000_000 + self.tick} +0000"}
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"]
        done = subprocess.run(
            ["git", "-C", str(self.path), *args], check=True, env=env, capture_output=True
        )
        return done.stdout.decode().strip()

    def status(self, *args: str) -> int:
        """The exit status of a git command that answers by it."""
        done = subprocess.run(["git", "-C", str(self.path), *args], env=ENV, capture_output=True)
        return done.returncode

    def write(self, path: str, text: str | None) -> None:
        target = self.path / path
        if text is None:
            self.git("rm", "-q", path)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        self.git("add", path)

    def commit(self, message: str, **files: str | None) -> str:
        for name, text in files.items():
            self.write(name.replace("__", "/"), text)
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")


def merge_based_history(path: Path) -> Repo:
    """A trunk that grows by merges of feature branches, with a path changed and changed
    back, a build file touched, a force-push to a rewritten line, and a rollback."""
    repo = Repo(path)
    path.mkdir(parents=True)
    repo.git("init", "-q", "-b", "main")
    repo.commit("root", src__app_py="v1\n", README="r\n")
    repo.heads.append(repo.head())
    for n in range(1, 4):
        repo.git("checkout", "-q", "-b", f"f{n}")
        repo.commit(f"feature {n}", **{f"src__f{n}_py": f"{n}\n"})
        if n == 2:
            repo.commit("touch app", src__app_py="v2\n")
            repo.commit("and back", src__app_py="v1\n")  # changed and changed back
        repo.git("checkout", "-q", "main")
        repo.commit(f"trunk {n}", docs__notes=f"{n}\n")
        repo.git("merge", "-q", "--no-ff", "-m", f"merge f{n}", f"f{n}")
        repo.heads.append(repo.head())
    repo.commit("build change", build__BUILD="b\n")
    repo.heads.append(repo.head())
    good = repo.head()
    repo.commit("remove notes", docs__notes=None)
    repo.heads.append(repo.head())
    # A force-push: trunk rewritten from two merges back.
    repo.git("checkout", "-q", "-b", "rewrite", repo.heads[1])
    repo.commit("rewritten", src__app_py="v3\n")
    repo.heads.append(repo.head())
    repo.git("checkout", "-q", "main")
    repo.heads.append(good)  # a rollback to a head trunk had before
    return repo
