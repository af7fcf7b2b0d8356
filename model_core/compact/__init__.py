"""Long inputs: the compact trace, its build through the one route, its streamed summary and exact windows."""
