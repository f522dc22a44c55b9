"""Adapters that let other libraries use mvdb: PyLate and colpali-engine (``pylate``, ``colpali``),
LangChain (``langchain``) and LlamaIndex (``llamaindex``), each an optional extra imported only
when its module is."""
