"""Tools: plain Python functions the model may call, alone or grouped in a `Toolkit`.

`tool.py` is the tool (its schema, argument validation, the call), `schema.py` reads the schema
from a signature and docstring, `toolkit.py` groups tools, `loop.py` is the long-lived event loop
async tools run on.
"""

from orchestrator.tools.tool import Tool, ToolContext, as_tool, tool
from orchestrator.tools.toolkit import Toolkit, flatten

__all__ = ["Tool", "ToolContext", "Toolkit", "as_tool", "flatten", "tool"]
