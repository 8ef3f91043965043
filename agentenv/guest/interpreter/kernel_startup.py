"""The cell a new python kernel runs first: the inline matplotlib backend, plain tracebacks,
and display formatters for a figure's chart (``e2b/chart``) and a DataFrame's columns
(``e2b/data``), which the outputs map to the Result's ``chart`` and ``data``."""

from __future__ import annotations

import inspect

from . import charts

# Runs in the user's namespace, so everything lives inside one function that deletes itself.
SETUP = """
def _aenv_setup():
    import math, os, sys
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    charts = {"__name__": "aenv_charts"}
    exec(compile(CHARTS_SOURCE, "aenv_charts", "exec"), charts)

    class ChartFormatter(BaseFormatter):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            # A figure exists only if matplotlib was imported: others skip the import.
            if "matplotlib" in sys.modules:
                from matplotlib.figure import Figure
                if isinstance(obj, Figure):
                    try:
                        return charts["figure_to_chart"](obj)
                    except Exception:
                        return None
            return super().__call__(obj)

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict,)

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is not None and isinstance(obj, pandas.DataFrame):
                try:
                    columns = obj.to_dict(orient="list")
                    return {str(k): [_cell(v) for v in col] for k, col in columns.items()}
                except Exception:
                    return None
            return super().__call__(obj)

    def _cell(value):
        if hasattr(value, "isoformat"):
            return value.isoformat()
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        return value

    shell = get_ipython()
    formatters = shell.display_formatter.formatters
    formatters["e2b/chart"] = ChartFormatter(parent=shell.display_formatter)
    formatters["e2b/data"] = DataFormatter(parent=shell.display_formatter)
    shell.colors = "nocolor"

_aenv_setup()
del _aenv_setup
"""


def code() -> str:
    return f"CHARTS_SOURCE = {inspect.getsource(charts)!r}\n{SETUP}\ndel CHARTS_SOURCE\n"
