"""The one route from a request to numbers: the request, the forward route and its gate, the trace and its shape."""
