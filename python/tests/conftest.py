"""pytest setup: a kernel cache of this session's own (so cache counts are this run's), and
fresh random data per run (FUSEDOPT_TEST_SEED replays one)."""
import os
import random
import tempfile

os.environ["FUSEDOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusedopt-pytest-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def seed():
    value = int(os.environ.get("FUSEDOPT_TEST_SEED", random.SystemRandom().randrange(2**31)))
    torch.manual_seed(value)
    print(f"seed {value} (FUSEDOPT_TEST_SEED={value} replays it)")
    return value


@pytest.fixture
def cache_dir():
    return os.environ["FUSEDOPT_CACHE_DIR"]
