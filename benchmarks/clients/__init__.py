"""Client processes of the versus_rabbitmq suite: one producer or consumer each, a JSON report on stdout."""
