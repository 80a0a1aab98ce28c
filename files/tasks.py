"""django-q2 entry points of the files app."""

import logging

from files import services

logger = logging.getLogger("openrelay.files")


def delete_expired_files():
    """Scheduled every 10 minutes as "files.delete_expired" (see files.apps)."""
    count = services.delete_expired_files()
    if count:
        logger.info("Deleted %d expired files", count)
    stale = services.delete_stale_upload_temp_files()
    if stale:
        logger.info("Deleted %d upload temp files left by interrupted uploads", stale)
    return count
