"""What a deployment's tokenizer counted of a stored file's sample, kept so that quoting the file again
asks the model server nothing.

A file's bytes never change and the sample is drawn with a fixed seed (records.RecordTally), so the
same file quoted again samples the same records, and the same deployment counts them the same. One
cache entry a file (`estimate:counted:<file id>`) holds, for each deployment that counted it, the
method and the sample's counts. Each is filed under what the count depends on: the deployment (its
id and creation, server URL, upstream name, key), the endpoint and the sampled lines; a deployment
edited since, or a sample drawn otherwise (the catalog now rejects other lines), misses and counts
again. Deleting the file deletes its entry (`forget`, on File's post_delete).

Django's cache holds it: Redis when REDIS_URL is set, so every web process shares it; the embedded
default keeps it in the process's memory. A cache that fails is a miss, never a failed quote.
"""

import hashlib
import logging

from django.core.cache import caches

logger = logging.getLogger("batches.estimate")

# Long enough for a file quoted over a few days; a file lives 30 days by default (files expire).
KEEP_S = 7 * 24 * 3600
# Deployments remembered a file: a model has a few; an entry stays a few KB (200 counts each).
MOST_DEPLOYMENTS = 16


def _key(file_id):
    return f"estimate:counted:{file_id}"


def _filed_under(deployment, tally):
    parts = [
        deployment.pk,
        deployment.created_at.timestamp(),
        deployment.base_url,
        deployment.upstream_name,
        deployment.api_key,  # hashed below with the rest: no key is stored
        tally.endpoint,
        [sampled.line for sampled in tally.sample],
    ]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def lookup(file_id, deployments, tally):
    """(method, counts) a deployment of `deployments` counted of the file's sample before, or None."""
    entry = _read(file_id)
    for deployment in deployments:
        found = entry.get(_filed_under(deployment, tally))
        if found is not None:
            return found
    return None


def store(file_id, deployment, tally, method, counts):
    entry = _read(file_id)
    entry[_filed_under(deployment, tally)] = (method, counts)
    while len(entry) > MOST_DEPLOYMENTS:
        del entry[next(iter(entry))]  # the oldest: dicts keep their order
    # Two quotes of one file on two deployments at once may each write without the other's counts:
    # the one lost is counted again at the next quote, which is all a lost entry costs.
    _guarded(lambda: caches["default"].set(_key(file_id), entry, KEEP_S))


def forget(file_id):
    _guarded(lambda: caches["default"].delete(_key(file_id)))


def cached(file_id):
    """True while some deployment's counts of the file are kept."""
    return bool(_read(file_id))


def file_deleted(sender, instance, **kwargs):
    """File's post_delete: its counts go with it."""
    forget(instance.public_id)


def _read(file_id):
    entry = _guarded(lambda: caches["default"].get(_key(file_id)))
    return entry if isinstance(entry, dict) else {}


def _guarded(operation):
    try:
        return operation()
    except Exception:  # the cache (Redis) is down: the quote counts as if nothing were kept
        logger.warning("quote: the tokenizer counts' cache is unavailable", exc_info=True)
        return None
