"""Content negotiation for downloads: file bytes whatever the client's Accept says."""

from rest_framework.negotiation import DefaultContentNegotiation


class IgnoreAcceptNegotiation(DefaultContentNegotiation):
    """The SDK asks for `Accept: application/binary`; bytes are what it gets, errors stay JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type
