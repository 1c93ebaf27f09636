"""The shared storage contract, run against the JetStream KV stores on a real broker."""

from __future__ import annotations

import pytest
from contracts import StoreContract
from nats_server import JsEnv

from stovepipe_fsm.adapters.jetstream import (
    KvCounter,
    KvQueueStore,
    KvRequestStore,
    KvStores,
    KvUriIndex,
    open_kv_stores,
)


class TestJetStreamStores(StoreContract):
    @pytest.fixture
    async def kv_stores(self, js_env: JsEnv) -> KvStores:
        return await open_kv_stores(js_env.js, js_env.topology)

    @pytest.fixture
    def request_store(self, kv_stores: KvStores) -> KvRequestStore:
        return kv_stores.requests

    @pytest.fixture
    def queue_store(self, kv_stores: KvStores) -> KvQueueStore:
        return kv_stores.queues

    @pytest.fixture
    def uri_index(self, kv_stores: KvStores) -> KvUriIndex:
        return kv_stores.uris

    @pytest.fixture
    def counter(self, kv_stores: KvStores) -> KvCounter:
        return kv_stores.counters
