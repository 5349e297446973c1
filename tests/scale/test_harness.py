"""The scale fixture's own rule: a job whose run failed because its master port was taken by a run
started beside it is started once more; any other failure stands."""

from __future__ import annotations

from helpers import PORT_TAKEN, Job


class _FakeRun:
    def __init__(self, code: int, text: str = ""):
        self.code, self._text = code, text

    def wait(self) -> int:
        return self.code

    def text(self) -> str:
        return self._text


def _job(tmp_path, first: _FakeRun, again: _FakeRun) -> tuple[Job, list]:
    started: list = []

    def restart():
        started.append(again)
        return [again]

    (tmp_path / "out").mkdir()
    return Job([first], tmp_path / "out", restart), started


def test_a_taken_port_starts_the_job_again(tmp_path):
    job, started = _job(tmp_path, _FakeRun(1, f"torch.distributed.DistNetworkError: ... {PORT_TAKEN} ..."), _FakeRun(0))
    assert job.wait() == [0] and len(started) == 1
    assert not (tmp_path / "out").exists()  # the failed attempt's directory is cleared first


def test_any_other_failure_stands(tmp_path):
    job, started = _job(tmp_path, _FakeRun(1, "ValueError: the layout is wrong"), _FakeRun(0))
    assert job.wait() == [1] and started == []
    (tmp_path / "ok").mkdir()
    job, started = _job(tmp_path / "ok", _FakeRun(0), _FakeRun(0))
    assert job.wait() == [0] and started == []
