"""The MySQL store's schema life cycle on a real MariaDB: init, check, refusals."""

from __future__ import annotations

import pytest

from stores import StoreConfigError, open_store
from stores.mysql import SCHEMA_VERSION, check_schema, init_schema
from tests.contract.test_store_contract import new_entity
from tests.services.mariadb import MariaDBPair

pytestmark = pytest.mark.mysql


async def test_init_schema_is_idempotent_and_keeps_data(mariadb_pair: MariaDBPair) -> None:
    uri = mariadb_pair.uri(mariadb_pair.new_database())
    await init_schema(uri)
    kept = new_entity()
    async with open_store(uri) as store:
        assert await store.save(kept) is True
    await init_schema(uri)
    info = await check_schema(uri)
    assert (info.version, info.shards) == (SCHEMA_VERSION, 16)
    async with open_store(uri) as store:
        assert await store.get(kept.message_id) == kept


async def test_missing_database_is_refused_with_the_init_command(mariadb_pair: MariaDBPair) -> None:
    uri = mariadb_pair.uri(mariadb_pair.new_database())
    with pytest.raises(StoreConfigError, match="kiteq-admin store init --store mysql://"):
        await open_store(uri).start()


async def test_empty_database_is_refused_with_the_init_command(mariadb_pair: MariaDBPair) -> None:
    database = mariadb_pair.new_database()
    mariadb_pair.master.execute(f"CREATE DATABASE {database}")
    with pytest.raises(StoreConfigError, match=r"has no KiteQ schema.*kiteq-admin store init"):
        await open_store(mariadb_pair.uri(database)).start()


async def test_older_schema_is_refused_until_init_upgrades_it(mariadb_pair: MariaDBPair) -> None:
    database = mariadb_pair.new_database()
    uri = mariadb_pair.uri(database)
    await init_schema(uri)
    mariadb_pair.master.execute(f"UPDATE {database}.kite_meta SET value = '0' WHERE name = 'schema_version'")
    with pytest.raises(StoreConfigError, match=r"older than .*kiteq-admin store init"):
        await open_store(uri).start()
    await init_schema(uri)
    async with open_store(uri) as store:
        assert (await store.stats()).details["schema_version"] == SCHEMA_VERSION


async def test_newer_schema_is_refused(mariadb_pair: MariaDBPair) -> None:
    database = mariadb_pair.new_database()
    uri = mariadb_pair.uri(database)
    await init_schema(uri)
    mariadb_pair.master.execute(f"UPDATE {database}.kite_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StoreConfigError, match="newer than this KiteQ-py"):
        await open_store(uri).start()
    with pytest.raises(StoreConfigError, match="newer"):
        await init_schema(uri)


async def test_shard_count_is_fixed_at_creation(mariadb_pair: MariaDBPair) -> None:
    database = mariadb_pair.new_database()
    await init_schema(mariadb_pair.uri(database, shards=4))
    with pytest.raises(StoreConfigError, match=r"created with shards=4.*open it with shards=4"):
        await open_store(mariadb_pair.uri(database)).start()
    with pytest.raises(StoreConfigError, match="created with shards=4"):
        await init_schema(mariadb_pair.uri(database, shards=8))
    async with open_store(mariadb_pair.uri(database, shards=4)) as store:
        entity = new_entity()
        assert await store.save(entity) is True
        assert await store.get(entity.message_id) == entity


async def test_missing_message_table_is_refused(mariadb_pair: MariaDBPair) -> None:
    database = mariadb_pair.new_database()
    uri = mariadb_pair.uri(database)
    await init_schema(uri)
    mariadb_pair.master.execute(f"DROP TABLE {database}.kite_msg_7")
    with pytest.raises(StoreConfigError, match="lacks 1 message tables"):
        await open_store(uri).start()
    await init_schema(uri)
    await check_schema(uri)
