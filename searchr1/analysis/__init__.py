"""Analysis tools: sweep comparison tables and plots, the paper's Table 2, the trajectory page, the study report."""
