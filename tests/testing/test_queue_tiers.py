"""A JavaScript queue consumer on real workerd (miniflare's broker) and the
embedded runtime's Python consumer meet the same deliveries for the same
messages and words: bodies, attempts, ids, timestamps, redeliveries."""

import pytest

from fidelity import queue_tiers

pytestmark = [pytest.mark.workerd]


@pytest.fixture(scope="module")
def on_workerd():
    return queue_tiers.run_workerd(max_retries=1)


def test_workerd_settles_the_queue(on_workerd):
    assert on_workerd["settled"]
    # Ten messages; 6 (retry), 7 (retryAll) and 9 (the handler threw) come once more.
    assert len(on_workerd["seen"]) == 13
    assert sorted(attempts for _, attempts, *_ in on_workerd["seen"]).count(2) == 3


def test_the_embedded_runtime_delivers_as_workerd_does(on_workerd):
    embedded = queue_tiers.run_embedded(max_retries=1)
    assert embedded["seen"] == on_workerd["seen"]
    assert embedded["counts"] == {"jobs": {"sent": 10, "acked": 7, "retried": 6, "dropped": 3}}
