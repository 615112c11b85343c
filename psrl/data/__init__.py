"""Prompt datasets: files on disk (jsonl, parquet, datasets directories) as train and val splits."""

from __future__ import annotations

from psrl.data.files import DataError, read_table
from psrl.data.prompts import PromptDataset, RenderSettings, load_split, render_prompt

__all__ = ["DataError", "PromptDataset", "RenderSettings", "load_split", "read_table", "render_prompt"]
