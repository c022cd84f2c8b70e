"""The worker's broker transport (loopwatch.broker) on a private redis-server: a channel closed
after its connection was collected, as Celery's worker closes it when Redis goes away while
messages are unacknowledged.

The state is reached with the call Connection.collect() ends with (_do_close_transport): the race
that leaves a channel open at that point (its first close failed on the dead socket before it was
marked closed) is in the worker's event loop; tests/faults/test_outages.py's "redis down, back
empty" meets it about one run in six."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection, Queue

from loopwatch.broker import Transport

pytestmark = pytest.mark.faults

TRANSPORT = "loopwatch.broker:Transport"


def _unacked_channel(url: str):
    """A connection and a channel of it holding one message taken and not acknowledged."""
    connection = Connection(url, transport=TRANSPORT)
    queue = Queue("tasks")
    with connection.Producer() as producer:
        producer.publish({"task": 1}, routing_key="tasks", declare=[queue])
    channel = connection.channel()
    message = queue(channel).get(no_ack=False)
    assert message is not None and message.payload == {"task": 1}
    return connection, channel


def test_celery_uses_it():
    from django.conf import settings

    from loopwatch.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis")  # the suite runs on Redis
    with app.connection_for_write() as connection:
        assert connection.transport_cls == TRANSPORT
        assert isinstance(connection.transport, Transport)


def test_closed_after_collect_its_messages_go_back(private_redis):
    connection, channel = _unacked_channel(private_redis.url())
    connection._do_close_transport()  # what collect() leaves: the transport without its client
    assert channel.connection.client is None
    channel.close()  # kombu's own Channel: AttributeError, 'NoneType' has no attribute 'hostname'
    assert private_redis.client().llen("tasks") == 1  # back in its queue, not stranded as unacked


def test_closed_after_collect_with_redis_away_fails_as_a_connection_error(private_redis):
    connection, channel = _unacked_channel(private_redis.url())
    private_redis.kill()
    connection._do_close_transport()
    # One of the errors Celery's teardown ignores (kombu.common.ignore_errors), then it reconnects;
    # the AttributeError was not one of them and shut the worker down.
    with pytest.raises(Transport.connection_errors) as raised:
        channel.close()
    assert isinstance(raised.value, redis.ConnectionError), raised.value
