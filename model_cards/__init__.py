"""Model card templates: Markdown with Jinja fields, filled by `transformers_longspec.hub.write_model_card`."""

from pathlib import Path

DRAFT_CARD_TEMPLATE = Path(__file__).parent / "longspec_draft.md"

__all__ = ["DRAFT_CARD_TEMPLATE"]
