"""Measuring heads: the twelve score formulas (scores), the scoring pass (scoring: HeadScores), thresholds from score distributions (distributions)."""
