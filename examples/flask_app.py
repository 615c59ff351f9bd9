"""A Flask app that publishes a `trade/pay-succ` message per HTTP request.

One kiteq.sync.Producer serves every request thread: it is thread-safe and its
sends are pipelined on shared broker connections. Create it once per process,
after any fork (gunicorn: in the app factory each worker calls, or `post_fork`).

    .venv/bin/pip install -e '.[test]'          # Flask comes with the test extra
    .venv/bin/python examples/flask_app.py --port 8000
    curl -X POST localhost:8000/orders -H 'content-type: application/json' -d '{"order_id": 7, "amount": 100}'

A body that is not a JSON object with an `order_id` (an integer or a short string) and an
optional numeric `amount` is answered 400 with {"error": ...}; every error is JSON.
It leaves nothing behind: the producer withdraws from the registry when the app stops.
"""

from __future__ import annotations

import argparse
import json

from flask import Flask, request
from werkzeug.exceptions import BadRequest, HTTPException

from kiteq import SendError, sync
from kiteq.logging import configure_logging

MAX_ORDER_BYTES = 16 * 1024  # an order is a few fields; larger bodies are refused (413)
MAX_ORDER_ID = 64  # the id travels as a message property, and properties are capped at 8 KiB


def parse_order(order: object) -> dict[str, object]:
    """The order, or BadRequest saying what is wrong with it (never a 500 for bad input)."""
    if not isinstance(order, dict):
        raise BadRequest('expected a JSON object such as {"order_id": 7, "amount": 100}')
    order_id = order.get("order_id")
    if isinstance(order_id, bool) or not isinstance(order_id, int | str) or order_id == "":
        raise BadRequest("order_id: expected an integer or a non-empty string")
    if len(str(order_id)) > MAX_ORDER_ID:
        raise BadRequest(f"order_id: at most {MAX_ORDER_ID} characters")
    amount = order.get("amount", 0)
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        raise BadRequest("amount: expected a number")
    return order


def create_app(producer: sync.Producer) -> Flask:
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_ORDER_BYTES

    @app.errorhandler(HTTPException)
    def json_error(exc: HTTPException) -> tuple[dict[str, object], int]:
        return {"error": exc.description}, exc.code or 500

    @app.post("/orders")
    def place_order() -> tuple[dict[str, object], int]:
        # silent: a body that is not JSON at all gives None, refused like any non-object.
        order = parse_order(request.get_json(force=True, silent=True))
        try:
            message_id = producer.send_string(
                "trade",
                "pay-succ",
                json.dumps(order),
                properties={"order_id": str(order["order_id"])},
                ttl=3600,  # a payment notice older than an hour is of no use to anyone
            )
        except SendError as exc:
            # Not stored: the client may retry; the same order resent gets a new message id,
            # so make the consumer idempotent on the order id (see idempotent_consumer.py).
            return {"error": str(exc)}, 503
        return {"message_id": message_id}, 201

    @app.get("/healthz")
    def healthz() -> tuple[dict[str, object], int]:
        return {"ok": True}, 200

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    configure_logging("warning")
    with sync.Producer(args.registry, group="order-svc", topics=["trade"], tls=args.tls_ca) as producer:
        # Flask's development server, one thread per request; Ctrl-C stops it, then the
        # `with` closes the producer.
        create_app(producer).run(args.host, args.port, threaded=True)
