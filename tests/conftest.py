from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def otlp_export_body(fixtures_dir: Path) -> bytes:
    """A real OTLP export request body, as vLLM POSTed it during a recorded run."""
    from attrib_agent.recording import OTLP, Recording, otlp_body

    rec = Recording(fixtures_dir / "recordings" / "shorts")
    return otlp_body(next(rec.records(OTLP)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files under tests/golden/ from the current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """golden(relpath, text): compare with tests/golden/<relpath>, or rewrite it with --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(relpath: str, text: str) -> None:
        path = Path(__file__).parent / "golden" / relpath
        if update or not path.exists():
            if not update:
                pytest.fail(f"golden file {path} missing; run pytest --update-golden to create it")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert text == path.read_text(), f"output differs from {path}; if intended, run pytest --update-golden"

    return check
