"""RabbitMQ side of versus_rabbitmq: a pika producer or consumer in a process of its own.

Both declare the durable classic queue. `produce`: persistent messages with publisher
confirms, `--window` unconfirmed at most (one publish per confirm that frees a slot;
a nacked message is republished, as a correct producer does), paced by an `Alarm`.
`consume`: manual acks, one per message, prefetch `--window`. Prints `ready` once
consuming (consume), then a JSON report. pika's SelectConnection (callbacks on one
thread): BlockingConnection waits for each confirm, so it cannot keep a window of them
outstanding.
"""

from __future__ import annotations

import itertools

import pika
from pika.adapters.select_connection import PollEvents
from pika.channel import Channel
from pika.spec import Basic, BasicProperties

from benchmarks.clients.pacing import Alarm
from benchmarks.clients.workload import QUEUE, Sends, Tally, arguments, emit

PERSISTENT = BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)


class Client:
    """Connects, opens a channel and declares the queue, then hands over to `ready`; the
    run ends at `finish` or after `timeout` seconds, whichever comes first."""

    def __init__(self, url: str, timeout: float) -> None:
        self.connection = pika.SelectConnection(
            pika.URLParameters(url),
            on_open_callback=lambda connection: connection.channel(on_open_callback=self._opened),
            on_open_error_callback=lambda _connection, error: self._stop(error),
            on_close_callback=lambda _connection, error: self._stop(error),
        )
        self.connection.ioloop.call_later(timeout, self.finish)
        self.channel: Channel | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        self.connection.ioloop.start()

    def _opened(self, channel: Channel) -> None:
        self.channel = channel
        channel.queue_declare(QUEUE, durable=True, callback=lambda _frame: self.ready(channel))

    def ready(self, channel: Channel) -> None:
        raise NotImplementedError

    def report(self) -> dict[str, object]:
        raise NotImplementedError

    def finish(self) -> None:
        if self.connection.is_open:
            self.connection.close()
        elif not self.connection.is_closing:
            self.connection.ioloop.stop()  # still connecting at the timeout

    def _stop(self, error: BaseException) -> None:
        if not isinstance(error, pika.exceptions.ConnectionClosedByClient):
            self.error = error
        self.connection.ioloop.stop()


class Publisher(Client):
    def __init__(self, url: str, timeout: float, sends: Sends, window: int) -> None:
        super().__init__(url, timeout)
        self.sends = sends
        self.window = window
        self.published = 0
        self.unconfirmed: dict[int, int] = {}  # delivery tag -> send index, in publish order
        self.tag = 0
        self.retries: list[int] = []
        self.alarm = Alarm()
        self.waiting = False  # the alarm is set for the next due send

    def ready(self, channel: Channel) -> None:
        channel.confirm_delivery(self._confirmed, callback=lambda _frame: self._begin())

    def _begin(self) -> None:
        self.connection.ioloop.add_handler(self.alarm.fd, self._due, PollEvents.READ)
        self.sends.start()
        self._publish()

    def _publish(self) -> None:
        """Publish while the window has room and the next send is due; else wait for either."""
        assert self.channel is not None
        while len(self.unconfirmed) < self.window:
            resend = bool(self.retries)
            if resend:
                index = self.retries.pop()
            elif self.published < self.sends.count:
                if self.sends.delay(self.published) > 0:
                    if not self.waiting:
                        self.waiting = True
                        self.alarm.set(self.sends.due_at(self.published))
                    return
                index = self.published
                self.published += 1
            else:
                return
            self.channel.basic_publish("", QUEUE, self.sends.body(index), PERSISTENT)
            if not resend:
                self.sends.left(index)
            self.tag += 1
            self.unconfirmed[self.tag] = index

    def _due(self, _fd: int, _events: int) -> None:
        self.alarm.clear()
        self.waiting = False
        self._publish()

    def _confirmed(self, frame: pika.frame.Method) -> None:
        method = frame.method
        if method.multiple:
            tags = list(itertools.takewhile(lambda tag: tag <= method.delivery_tag, self.unconfirmed))
        else:
            tags = [method.delivery_tag]
        indexes = [self.unconfirmed.pop(t) for t in tags]
        if isinstance(method, Basic.Nack):
            self.sends.refused += len(indexes)
            self.retries += indexes
        else:
            self.sends.confirm(indexes)
        if self.sends.done:
            self.finish()
        else:
            self._publish()

    def report(self) -> dict[str, object]:
        return self.sends.report()


class Subscriber(Client):
    def __init__(self, url: str, timeout: float, tally: Tally, prefetch: int) -> None:
        super().__init__(url, timeout)
        self.tally = tally
        self.prefetch = prefetch

    def ready(self, channel: Channel) -> None:
        channel.basic_qos(prefetch_count=self.prefetch, callback=lambda _frame: self._subscribe(channel))

    def _subscribe(self, channel: Channel) -> None:
        channel.basic_consume(QUEUE, self._delivered, callback=lambda _frame: print("ready", flush=True))

    def _delivered(
        self, channel: Channel, method: Basic.Deliver, _properties: BasicProperties, body: bytes
    ) -> None:
        done = self.tally.record(body)
        channel.basic_ack(method.delivery_tag)
        if done:
            self.finish()

    def report(self) -> dict[str, object]:
        return self.tally.report()


def main() -> int:
    args = arguments(__doc__ or "")
    client: Client
    if args.role == "produce":
        client = Publisher(args.target, args.timeout, Sends(args.count, args.rate, args.first), args.window)
    else:
        client = Subscriber(args.target, args.timeout, Tally(args.count), args.window)
    client.run()
    report = client.report()
    if client.error is not None:
        report |= {"complete": False, "error": repr(client.error)}
    return emit(report)


if __name__ == "__main__":
    raise SystemExit(main())
