"""Text datasets: AG News as next-word language modelling (`ag_news.py`), Shakespeare as
next-character prediction (`shakespeare.py`), both tokenised into int64 ids by `tokens.py`.
Importing this package registers both datasets."""

from clusterfed.data.text import ag_news, shakespeare

__all__ = ["ag_news", "shakespeare"]
